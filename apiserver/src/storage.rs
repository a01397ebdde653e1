//! Objects on the raft store: how they are encoded, read and written.
//!
//! An object is stored as its JSON without `metadata.resourceVersion`: the
//! version is the key's mod revision, known only once the write commits, and
//! is spliced into the bytes on the way out (no decode needed to serve a
//! list or a watch event). Every write is one store transaction whose
//! compares make it optimistic: a create requires the key to be absent, an
//! update or delete requires the mod revision the caller read.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use skiff_api::ApiError;
use skiff_raft_store::types::{
    ApplyError, Command, Compare, CompareResult, CompareTarget, DeleteRequest, KeyValue, Op, Output, PutRequest,
    RangeRequest, Txn,
};
use skiff_raft_store::{Store, StoreError};

use crate::encryption::{self, Encryption, Opened};

/// etcd's request limit, which Kubernetes objects inherit.
pub const MAX_OBJECT_BYTES: usize = 1536 * 1024;

/// How long a read naming a revision this member has not applied yet waits
/// for it before answering "too large resource version".
const WAIT_FOR_REVISION: Duration = Duration::from_secs(3);

/// The end of the range of every key starting with `prefix`.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// The stored bytes of `obj`: its JSON without `resourceVersion`.
pub fn encode(obj: &Value) -> Vec<u8> {
    serde_json::to_vec(&Unversioned(obj)).expect("JSON values serialize")
}

/// An object serialized as it is, but for its `metadata.resourceVersion`:
/// no copy of the object is made to leave it out.
struct Unversioned<'a>(&'a Value);

/// An object's metadata without its `resourceVersion`.
struct UnversionedMeta<'a>(&'a serde_json::Map<String, Value>);

impl serde::Serialize for Unversioned<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let Value::Object(fields) = self.0 else { return self.0.serialize(s) };
        let mut map = s.serialize_map(Some(fields.len()))?;
        for (k, v) in fields {
            match v {
                Value::Object(meta) if k == "metadata" => map.serialize_entry(k, &UnversionedMeta(meta))?,
                _ => map.serialize_entry(k, v)?,
            }
        }
        map.end()
    }
}

impl serde::Serialize for UnversionedMeta<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().filter(|(name, _)| *name != "resourceVersion"))
    }
}

/// `stored` with `"resourceVersion":"<revision>"` added to its top-level
/// `metadata`. Works on the bytes: a depth-aware scan finds the metadata
/// object, so no decode is needed.
pub fn with_resource_version(stored: &[u8], revision: i64) -> Vec<u8> {
    const KEY: &[u8] = b"\"metadata\"";
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    let mut i = 0;
    while i < stored.len() {
        let b = stored[i];
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            i += 1;
            continue;
        }
        match b {
            b'"' => {
                if depth == 1 && stored[i..].starts_with(KEY) {
                    // Skip the key, whitespace and ':' to the opening brace.
                    let mut j = i + KEY.len();
                    while j < stored.len() && (stored[j] == b':' || stored[j].is_ascii_whitespace()) {
                        j += 1;
                    }
                    if j < stored.len() && stored[j] == b'{' {
                        let mut out = Vec::with_capacity(stored.len() + 32);
                        out.extend_from_slice(&stored[..=j]);
                        out.extend_from_slice(format!("\"resourceVersion\":\"{revision}\"").as_bytes());
                        let rest = &stored[j + 1..];
                        let empty = rest.iter().find(|c| !c.is_ascii_whitespace()) == Some(&b'}');
                        if !empty {
                            out.push(b',');
                        }
                        out.extend_from_slice(rest);
                        return out;
                    }
                }
                in_string = true;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    // No metadata object (not written by Skiff): fall back to a decode.
    match serde_json::from_slice::<Value>(stored) {
        Ok(mut v) if v.is_object() => {
            skiff_api::meta::set_resource_version(&mut v, revision);
            serde_json::to_vec(&v).expect("JSON values serialize")
        }
        _ => stored.to_vec(),
    }
}

/// One stored object as read: its bytes (resourceVersion included) and
/// revisions.
#[derive(Clone, Debug)]
pub struct Stored {
    pub key: Vec<u8>,
    pub json: Vec<u8>,
    pub mod_revision: i64,
    pub create_revision: i64,
    /// Written with an encryption key (or none) that is no longer the one
    /// writes use: an update writes it again even if nothing changed.
    pub stale: bool,
}

impl Stored {
    /// `kv` as stored in the clear.
    pub fn from_kv(kv: KeyValue) -> Stored {
        Stored {
            json: with_resource_version(&kv.value, kv.mod_revision),
            key: kv.key,
            mod_revision: kv.mod_revision,
            create_revision: kv.create_revision,
            stale: false,
        }
    }

    pub fn decode(&self) -> Result<Value, ApiError> {
        serde_json::from_slice(&self.json).map_err(|e| {
            ApiError::internal(format!("stored object {} is not JSON: {e}", String::from_utf8_lossy(&self.key)))
        })
    }
}

/// Every store failure as the client sees it.
pub fn store_error(e: StoreError) -> ApiError {
    match e {
        StoreError::Apply(ApplyError::Compacted { compacted }) => ApiError::expired(format!(
            "The resourceVersion for the provided list is too old (compacted at {compacted})"
        )),
        StoreError::Apply(ApplyError::FutureRevision { current }) => {
            ApiError::timeout(format!("Too large resource version, current revision is {current}"))
        }
        StoreError::Timeout => ApiError::timeout("request did not complete within the allowed duration"),
        StoreError::NoLeader => ApiError::unavailable("the cluster has no leader; retry later"),
        StoreError::NotLeader { .. } => ApiError::unavailable("not the leader; retry"),
        StoreError::Unavailable(m) => ApiError::unavailable(m),
        e @ (StoreError::Stopped | StoreError::Peer(_) | StoreError::Raft { .. }) => {
            ApiError::unavailable(e.to_string())
        }
        StoreError::NoSpace => ApiError::internal("etcdserver: mvcc: database space exceeded"),
        other => ApiError::internal(other.to_string()),
    }
}

/// Waits until this member has applied `revision` (a read asking for "at
/// least N" on a member that is behind).
pub async fn wait_for_revision(store: &Store, revision: i64) -> Result<(), ApiError> {
    match tokio::time::timeout(WAIT_FOR_REVISION, store.wait_for_revision(revision)).await {
        Ok(()) => Ok(()),
        Err(_) => {
            Err(ApiError::timeout(format!("Too large resource version: {revision}, current: {}", store.revision())))
        }
    }
}

/// How a read should see the store, from a request's resourceVersion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Consistency {
    /// `""`: every write acknowledged before the read (a quorum round).
    Linearizable,
    /// `"0"`: whatever this member has applied.
    Any,
    /// `"N"`: at least revision N.
    AtLeast(i64),
    /// `"N"` with `resourceVersionMatch=Exact`, or a continue token.
    Exact(i64),
}

impl Consistency {
    /// Parses a resourceVersion parameter with its match rule.
    pub fn parse(resource_version: &str, version_match: &str) -> Result<Consistency, ApiError> {
        let rv = match resource_version {
            "" => None,
            s => Some(parse_resource_version(s)?),
        };
        match (version_match, rv) {
            ("", None) => Ok(Consistency::Linearizable),
            ("", Some(0)) | ("NotOlderThan", Some(0)) => Ok(Consistency::Any),
            ("", Some(n)) | ("NotOlderThan", Some(n)) => Ok(Consistency::AtLeast(n)),
            ("Exact", Some(0)) => {
                Err(ApiError::bad_request("resourceVersionMatch \"Exact\" is forbidden for resourceVersion \"0\""))
            }
            ("Exact", Some(n)) => Ok(Consistency::Exact(n)),
            ("Exact" | "NotOlderThan", None) => Err(ApiError::bad_request(format!(
                "resourceVersionMatch is forbidden unless resourceVersion is provided (got {version_match:?})"
            ))),
            (other, _) => Err(ApiError::bad_request(format!(
                "unsupported resourceVersionMatch {other:?}: supported values: \"Exact\", \"NotOlderThan\""
            ))),
        }
    }
}

/// A resourceVersion as a revision; anything else is a 400 naming it.
pub fn parse_resource_version(s: &str) -> Result<i64, ApiError> {
    s.parse::<i64>().ok().filter(|n| *n >= 0).ok_or_else(|| {
        ApiError::bad_request(format!("invalid resource version: \"{s}\" is not a non-negative integer"))
    })
}

/// Thin typed access to the store for the registry: every object read is
/// decrypted and every write encrypted here, as `encryption` says.
#[derive(Clone)]
pub struct ObjectStore {
    pub store: Store,
    pub encryption: Encryption,
    /// The objects of the small ranges admission reads on every pod
    /// create, decoded, with the revisions they were decoded at:
    /// [`ObjectStore::range_decoded`].
    decoded: Arc<Mutex<DecodedRanges>>,
}

/// Decoded ranges by their (start, end).
type DecodedRanges = HashMap<(Vec<u8>, Vec<u8>), Decoded>;

/// A range's objects as decoded at their revisions.
struct Decoded {
    versions: Vec<(Vec<u8>, i64)>,
    objects: Arc<[Value]>,
}

/// Ranges whose decoded objects are kept; past it all are dropped.
const DECODED_RANGES_MAX: usize = 64;

/// What a range read found, at which store revision.
pub struct Page {
    pub items: Vec<Stored>,
    /// More keys remain after `items` in the range.
    pub more: bool,
    /// Keys in the whole range from its start (for remainingItemCount).
    pub count: i64,
    pub revision: i64,
}

impl ObjectStore {
    pub fn new(store: Store, encryption: Encryption) -> ObjectStore {
        ObjectStore { store, encryption, decoded: Arc::default() }
    }

    /// The plain bytes stored under `key`; a value that cannot be
    /// decrypted is an internal error naming the key.
    pub fn open<'a>(&self, key: &[u8], value: &'a [u8]) -> Result<Opened<'a>, ApiError> {
        self.encryption.open(key, value).map_err(ApiError::internal)
    }

    /// `kv` decrypted, with its resourceVersion spliced in.
    pub fn stored(&self, kv: KeyValue) -> Result<Stored, ApiError> {
        if self.encryption.is_empty() && !kv.value.starts_with(encryption::PREFIX) {
            return Ok(Stored::from_kv(kv));
        }
        let opened = self.open(&kv.key, &kv.value)?;
        Ok(Stored {
            json: with_resource_version(&opened.bytes, kv.mod_revision),
            stale: opened.stale,
            key: kv.key,
            mod_revision: kv.mod_revision,
            create_revision: kv.create_revision,
        })
    }

    /// Makes this member's state fit `consistency`; returns the revision
    /// to read at (0: this member's current).
    pub async fn prepare_read(&self, consistency: Consistency) -> Result<i64, ApiError> {
        match consistency {
            Consistency::Linearizable => self.store.linearize().await.map_err(store_error).map(|_| 0),
            Consistency::Any => Ok(0),
            Consistency::AtLeast(n) => wait_for_revision(&self.store, n).await.map(|_| 0),
            Consistency::Exact(n) => wait_for_revision(&self.store, n).await.map(|_| n),
        }
    }

    /// One key at `revision` (0: current), read locally, on the calling
    /// task (one seek at most: see [`ObjectStore::range_small`]).
    pub async fn get(&self, key: &str, revision: i64) -> Result<(Option<Stored>, i64), ApiError> {
        let req = RangeRequest { key: key.as_bytes().to_vec(), revision, ..Default::default() };
        let (r, header) = self.store.range_small(&req).map_err(store_error)?;
        let found = r.kvs.into_iter().next().map(|kv| self.stored(kv)).transpose()?;
        Ok((found, header.revision))
    }

    /// Keys in `[start, end)` at `revision` (0: current), at most `limit`
    /// (0: all), read locally.
    pub async fn range(&self, start: &[u8], end: &[u8], revision: i64, limit: i64) -> Result<Page, ApiError> {
        let req = RangeRequest { key: start.to_vec(), range_end: end.to_vec(), revision, limit, ..Default::default() };
        let (r, header) = self.store.range(req, true).await.map_err(store_error)?;
        let revision = if revision > 0 { revision } else { header.revision };
        let items = r.kvs.into_iter().map(|kv| self.stored(kv)).collect::<Result<_, _>>()?;
        Ok(Page { items, more: r.more, count: r.count, revision })
    }

    /// [`ObjectStore::range`] for a range known to hold a few keys (a
    /// namespace's quotas or limit ranges, the cluster's PriorityClasses:
    /// what admission reads on every write), read on the calling task.
    pub fn range_small(&self, start: &[u8], end: &[u8], revision: i64) -> Result<Page, ApiError> {
        let req = RangeRequest { key: start.to_vec(), range_end: end.to_vec(), revision, ..Default::default() };
        let (r, header) = self.store.range_small(&req).map_err(store_error)?;
        let revision = if revision > 0 { revision } else { header.revision };
        let items = r.kvs.into_iter().map(|kv| self.stored(kv)).collect::<Result<_, _>>()?;
        Ok(Page { items, more: r.more, count: r.count, revision })
    }

    /// The objects of [`ObjectStore::range_small`], decoded. The decoded
    /// objects of up to [`DECODED_RANGES_MAX`] ranges are kept, each with
    /// the keys and revisions it was decoded from, and answered again
    /// while the range holds the same keys at the same revisions: the
    /// PriorityClasses every pod create reads are decoded once, not on
    /// every create.
    pub fn range_decoded(&self, start: &[u8], end: &[u8], revision: i64) -> Result<Arc<[Value]>, ApiError> {
        let req = RangeRequest { key: start.to_vec(), range_end: end.to_vec(), revision, ..Default::default() };
        let (r, _) = self.store.range_small(&req).map_err(store_error)?;
        let same = |d: &Decoded| {
            d.versions.len() == r.kvs.len()
                && d.versions.iter().zip(&r.kvs).all(|((k, m), kv)| *k == kv.key && *m == kv.mod_revision)
        };
        let range = (start.to_vec(), end.to_vec());
        if let Some(d) = self.decoded.lock().expect("decoded ranges lock").get(&range).filter(|d| same(d)) {
            return Ok(d.objects.clone());
        }
        let versions: Vec<(Vec<u8>, i64)> = r.kvs.iter().map(|kv| (kv.key.clone(), kv.mod_revision)).collect();
        let objects: Arc<[Value]> =
            r.kvs.into_iter().map(|kv| self.stored(kv)?.decode()).collect::<Result<Vec<_>, _>>()?.into();
        let mut decoded = self.decoded.lock().expect("decoded ranges lock");
        if decoded.len() >= DECODED_RANGES_MAX && !decoded.contains_key(&range) {
            decoded.clear();
        }
        decoded.insert(range, Decoded { versions, objects: objects.clone() });
        Ok(objects)
    }

    /// Runs `txn`, its puts encrypted; returns whether its compares held
    /// and the store revision after it. Values its reads return are as
    /// stored (callers only look at which keys exist).
    pub async fn txn(&self, mut txn: Txn) -> Result<(bool, Vec<skiff_raft_store::types::OpResult>, i64), ApiError> {
        if !self.encryption.is_empty() {
            for op in txn.success.iter_mut().chain(txn.failure.iter_mut()) {
                if let Op::Put(put) = op {
                    put.value = self.encryption.seal(&put.key, std::mem::take(&mut put.value));
                }
            }
        }
        match self.store.write(Command::Txn(txn)).await.map_err(store_error)? {
            Output::Txn { result, revision } => Ok((result.succeeded, result.responses, revision)),
            other => Err(ApiError::internal(format!("unexpected store output {other:?}"))),
        }
    }
}

pub fn put(key: &str, value: Vec<u8>) -> Op {
    Op::Put(PutRequest { key: key.as_bytes().to_vec(), value, ..Default::default() })
}

pub fn delete(key: &str) -> Op {
    Op::DeleteRange(DeleteRequest { key: key.as_bytes().to_vec(), ..Default::default() })
}

/// Deletes every key that starts with `prefix`.
pub fn delete_prefix(prefix: &str) -> Op {
    Op::DeleteRange(DeleteRequest {
        key: prefix.as_bytes().to_vec(),
        range_end: prefix_end(prefix.as_bytes()),
        ..Default::default()
    })
}

pub fn get_op(key: &str) -> Op {
    Op::Range(RangeRequest { key: key.as_bytes().to_vec(), ..Default::default() })
}

/// The key does not exist.
pub fn absent(key: &str) -> Compare {
    Compare {
        result: CompareResult::Equal,
        target: CompareTarget::CreateRevision(0),
        key: key.as_bytes().to_vec(),
        range_end: Vec::new(),
    }
}

/// The key was last written at `revision`.
pub fn unchanged_since(key: &str, revision: i64) -> Compare {
    Compare {
        result: CompareResult::Equal,
        target: CompareTarget::ModRevision(revision),
        key: key.as_bytes().to_vec(),
        range_end: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn resource_version_is_spliced_into_the_top_level_metadata() {
        let obj = json!({"apiVersion": "v1", "data": {"metadata": "{not this}"}, "kind": "ConfigMap",
            "metadata": {"name": "a"}, "spec": {"template": {"metadata": {"labels": {}}}}});
        let stored = encode(&obj);
        let out: Value = serde_json::from_slice(&with_resource_version(&stored, 42)).unwrap();
        assert_eq!(out["metadata"]["resourceVersion"], "42");
        assert_eq!(out["metadata"]["name"], "a");
        assert!(out["spec"]["template"]["metadata"].get("resourceVersion").is_none());
        assert_eq!(out["data"]["metadata"], "{not this}");
    }

    #[test]
    fn resource_version_is_spliced_into_empty_metadata_and_replaces_a_stored_one() {
        let out: Value = serde_json::from_slice(&with_resource_version(br#"{"metadata":{}}"#, 7)).unwrap();
        assert_eq!(out, json!({"metadata": {"resourceVersion": "7"}}));
        let stored = encode(&json!({"metadata": {"resourceVersion": "3", "name": "x"}}));
        let out: Value = serde_json::from_slice(&with_resource_version(&stored, 9)).unwrap();
        assert_eq!(out["metadata"]["resourceVersion"], "9");
    }

    #[test]
    fn the_stored_bytes_are_the_object_without_its_resource_version() {
        let obj = json!({"apiVersion": "v1", "kind": "Pod",
                         "metadata": {"name": "p", "resourceVersion": "3", "labels": {"resourceVersion": "kept"}},
                         "spec": {"resourceVersion": "kept"}, "status": {}});
        let mut expected = obj.clone();
        expected["metadata"].as_object_mut().unwrap().remove("resourceVersion");
        assert_eq!(encode(&obj), serde_json::to_vec(&expected).unwrap());
        for other in [json!({"kind": "X"}), json!({"metadata": "not an object"}), json!([1]), json!(null)] {
            assert_eq!(encode(&other), serde_json::to_vec(&other).unwrap(), "{other}");
        }
    }

    #[test]
    fn resource_versions_parse_with_their_match_rule() {
        assert_eq!(Consistency::parse("", "").unwrap(), Consistency::Linearizable);
        assert_eq!(Consistency::parse("0", "").unwrap(), Consistency::Any);
        assert_eq!(Consistency::parse("12", "").unwrap(), Consistency::AtLeast(12));
        assert_eq!(Consistency::parse("12", "Exact").unwrap(), Consistency::Exact(12));
        assert_eq!(Consistency::parse("abc", "").unwrap_err().code(), 400);
        assert_eq!(Consistency::parse("-1", "").unwrap_err().code(), 400);
        assert_eq!(Consistency::parse("", "Exact").unwrap_err().code(), 400);
        assert_eq!(Consistency::parse("5", "Sometimes").unwrap_err().code(), 400);
    }

    #[test]
    fn prefix_end_covers_every_key_under_the_prefix() {
        assert_eq!(prefix_end(b"/registry/pods/"), b"/registry/pods0".to_vec());
    }
}
