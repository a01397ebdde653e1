//! Decoding of `application/vnd.kubernetes.protobuf` request bodies into the
//! Kubernetes JSON for the same object.
//!
//! Since client-go 1.32, kubectl's typed commands (`create namespace`,
//! `create deployment|configmap|secret|serviceaccount|job|…`, `auth can-i`,
//! `auth whoami`) send their bodies as protobuf: the magic `k8s\0` followed by
//! a `runtime.Unknown` message whose `typeMeta` names the apiVersion and kind
//! and whose `raw` is the object in the numbering of k8s.io/api's
//! `generated.proto`. Skiff stores and serves JSON, so [`decode`] turns such a
//! body into exactly the JSON Go's `encoding/json` would write for the object:
//! `apiVersion`/`kind` from the envelope, camelCase names, unset and
//! `omitempty`-zero fields left out, `Quantity` as a string, `IntOrString` as
//! an int or a string, `Time`/`MicroTime` as RFC 3339 (`null` for the zero
//! time, as `creationTimestamp: null`), `bytes` as base64.
//!
//! The messages come from the vendored `.proto` files under `api/proto/`
//! (compiled to descriptors by `build.rs`) and are decoded dynamically with
//! `prost-reflect`, so every kind of the vendored groups is covered at once.
//! What the `.proto` files cannot tell (which Go fields are pointers, carry
//! `omitempty` or are inlined) comes from a table generated from the Go types
//! (`api/proto/gen_go_fields.py`).
//!
//! Supported groups: core `v1`, `apps/v1`, `batch/v1`, `autoscaling/v1`,
//! `autoscaling/v2`, `policy/v1`, `coordination.k8s.io/v1`,
//! `authorization.k8s.io/v1`, `authentication.k8s.io/v1`,
//! `rbac.authorization.k8s.io/v1`, `networking.k8s.io/v1`,
//! `scheduling.k8s.io/v1`: any top-level kind (a message whose field 1 is
//! `metadata`) in them. Anything else is [`ProtobufError::UnsupportedKind`],
//! which a server answers with 415.
//!
//! No input makes this panic: malformed bodies are errors.

use std::sync::OnceLock;

use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor, Value as PValue};
use serde_json::Value;

mod go;
#[rustfmt::skip]
mod go_fields;
mod json;
#[cfg(test)]
mod tests;

/// The media type of Kubernetes protobuf bodies.
pub const CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// The four bytes (`k8s\0`) every Kubernetes protobuf body starts with.
pub const MAGIC: [u8; 4] = *b"k8s\0";

const UNKNOWN: &str = "k8s.io.apimachinery.pkg.runtime.Unknown";

/// API group → the `k8s.io.api.<package>` its protos live in.
const GROUPS: &[(&str, &str)] = &[
    ("", "core"),
    ("apps", "apps"),
    ("batch", "batch"),
    ("autoscaling", "autoscaling"),
    ("policy", "policy"),
    ("coordination.k8s.io", "coordination"),
    ("authorization.k8s.io", "authorization"),
    ("authentication.k8s.io", "authentication"),
    ("rbac.authorization.k8s.io", "rbac"),
    ("networking.k8s.io", "networking"),
    ("scheduling.k8s.io", "scheduling"),
];

/// Why a protobuf body could not be turned into JSON.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtobufError {
    /// The body does not start with `k8s\0`.
    #[error("protobuf body does not start with the Kubernetes magic bytes \"k8s\\x00\"")]
    MissingMagic,
    /// The `runtime.Unknown` envelope is not valid protobuf.
    #[error("malformed protobuf envelope (runtime.Unknown): {0}")]
    Envelope(String),
    /// The envelope has no apiVersion or kind.
    #[error("protobuf envelope has no apiVersion/kind (typeMeta)")]
    MissingTypeMeta,
    /// The envelope says the object is compressed or in another format.
    #[error("unsupported protobuf envelope {field} {value:?} for {api_version}/{kind}")]
    UnsupportedEncoding {
        /// `contentEncoding` or `contentType`.
        field: &'static str,
        /// Its value.
        value: String,
        /// The object's apiVersion.
        api_version: String,
        /// The object's kind.
        kind: String,
    },
    /// No protobuf schema for this apiVersion/kind.
    #[error("protobuf is not supported for apiVersion {api_version:?} kind {kind:?}; send application/json")]
    UnsupportedKind {
        /// The object's apiVersion.
        api_version: String,
        /// The object's kind.
        kind: String,
    },
    /// The object bytes do not decode as that kind, or hold a value JSON cannot carry.
    #[error("malformed protobuf {api_version} {kind}{}: {message}", if path.is_empty() { String::new() } else { format!(" at {path}") })]
    Malformed {
        /// The object's apiVersion.
        api_version: String,
        /// The object's kind.
        kind: String,
        /// JSON path of the offending field; empty for the whole object.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// The compiled descriptors embedded at build time are unusable (a build problem, not the input's).
    #[error("embedded Kubernetes protobuf descriptors are unusable: {0}")]
    Descriptors(String),
}

/// The descriptors of the vendored Kubernetes protos, decoded once.
fn pool() -> Result<&'static DescriptorPool, ProtobufError> {
    static POOL: OnceLock<Result<DescriptorPool, String>> = OnceLock::new();
    POOL.get_or_init(|| {
        DescriptorPool::decode(&include_bytes!(concat!(env!("OUT_DIR"), "/k8s_descriptors.bin"))[..])
            .map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|e| ProtobufError::Descriptors(e.clone()))
}

/// Decodes a Kubernetes protobuf body (`k8s\0` + `runtime.Unknown`) into the
/// object's JSON, with `apiVersion` and `kind` set from the envelope.
pub fn decode(body: &[u8]) -> Result<Value, ProtobufError> {
    let envelope = Envelope::parse(body)?;
    let malformed = |path: String, message: String| ProtobufError::Malformed {
        api_version: envelope.api_version.clone(),
        kind: envelope.kind.clone(),
        path,
        message,
    };
    let desc = message_for(&envelope.api_version, &envelope.kind)?;
    let msg =
        DynamicMessage::decode(desc, envelope.raw.as_slice()).map_err(|e| malformed(String::new(), e.to_string()))?;
    let mut obj = match json::message(&msg) {
        Ok(Value::Object(obj)) => obj,
        Ok(_) => return Err(malformed(String::new(), "not an object".to_string())),
        Err(e) => return Err(malformed(e.path, e.message)),
    };
    obj.insert("apiVersion".to_string(), Value::String(envelope.api_version));
    obj.insert("kind".to_string(), Value::String(envelope.kind));
    Ok(Value::Object(obj))
}

/// The apiVersion and kind a protobuf body declares, without decoding the object
/// (for error messages and routing).
pub fn type_meta(body: &[u8]) -> Result<(String, String), ProtobufError> {
    Envelope::parse(body).map(|e| (e.api_version, e.kind))
}

/// Whether [`decode`] knows the schema of `apiVersion`/`kind`.
pub fn supports(api_version: &str, kind: &str) -> bool {
    message_for(api_version, kind).is_ok()
}

/// The decoded `runtime.Unknown`.
struct Envelope {
    api_version: String,
    kind: String,
    raw: Vec<u8>,
}

impl Envelope {
    fn parse(body: &[u8]) -> Result<Envelope, ProtobufError> {
        let rest = body.strip_prefix(&MAGIC[..]).ok_or(ProtobufError::MissingMagic)?;
        let desc = pool()?
            .get_message_by_name(UNKNOWN)
            .ok_or_else(|| ProtobufError::Descriptors(format!("{UNKNOWN} is missing")))?;
        let unknown = DynamicMessage::decode(desc, rest).map_err(|e| ProtobufError::Envelope(e.to_string()))?;
        let text = |msg: &DynamicMessage, name: &str| match msg.get_field_by_name(name).as_deref() {
            Some(PValue::String(s)) => s.clone(),
            _ => String::new(),
        };
        let (api_version, kind) = match unknown.get_field_by_name("typeMeta").as_deref() {
            Some(PValue::Message(tm)) => (text(tm, "apiVersion"), text(tm, "kind")),
            _ => (String::new(), String::new()),
        };
        if api_version.is_empty() || kind.is_empty() {
            return Err(ProtobufError::MissingTypeMeta);
        }
        let unsupported = |field: &'static str, value: String| ProtobufError::UnsupportedEncoding {
            field,
            value,
            api_version: api_version.clone(),
            kind: kind.clone(),
        };
        let encoding = text(&unknown, "contentEncoding");
        if !encoding.is_empty() {
            return Err(unsupported("contentEncoding", encoding));
        }
        let content_type = text(&unknown, "contentType");
        if !content_type.is_empty() && content_type != CONTENT_TYPE {
            return Err(unsupported("contentType", content_type));
        }
        let raw = match unknown.get_field_by_name("raw").as_deref() {
            Some(PValue::Bytes(b)) => b.to_vec(),
            _ => Vec::new(),
        };
        Ok(Envelope { api_version, kind, raw })
    }
}

/// The meta/v1 message client-go sends as a request body in any group's
/// version (a DELETE's options: `kubectl drain`, `kubectl delete` through
/// the typed clients), as Kubernetes registers it in every one.
const DELETE_OPTIONS: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.DeleteOptions";

/// The message of a top-level `apiVersion`/`kind` (one whose field 1 is
/// `metadata`, or `DeleteOptions`).
fn message_for(api_version: &str, kind: &str) -> Result<MessageDescriptor, ProtobufError> {
    let unsupported =
        || ProtobufError::UnsupportedKind { api_version: api_version.to_string(), kind: kind.to_string() };
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let ident = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric());
    if !ident(version) || !ident(kind) {
        return Err(unsupported());
    }
    if kind == "DeleteOptions" && (group == "meta.k8s.io" || GROUPS.iter().any(|(g, _)| *g == group)) {
        return pool()?.get_message_by_name(DELETE_OPTIONS).ok_or_else(unsupported);
    }
    let package = GROUPS.iter().find(|(g, _)| *g == group).map(|(_, p)| *p).ok_or_else(unsupported)?;
    let desc =
        pool()?.get_message_by_name(&format!("k8s.io.api.{package}.{version}.{kind}")).ok_or_else(unsupported)?;
    match desc.get_field(1) {
        Some(fd) if fd.name() == "metadata" => Ok(desc),
        _ => Err(unsupported()),
    }
}
