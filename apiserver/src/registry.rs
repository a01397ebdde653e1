//! The registry: Kubernetes semantics on top of the object store.
//!
//! A write flows: authorize → decode and normalize → priority admission
//! (which reads PriorityClasses, see [`priority`]) → defaulting →
//! LimitRanger on pod creates (which reads LimitRanges, see [`limits`]) →
//! admission (mutating, then validating; PodSecurity reads the pod's
//! namespace, see [`pod_security`]) → validation → on creates, the
//! ResourceQuota charge (see [`quota`]) → one store transaction with
//! optimistic compares (the charged quotas' among them). What a kind does beyond that
//! (status rules, generation, allocations, graceful deletion, namespace
//! finalization) is its [`strategy`](crate::strategy)'s, asked at fixed
//! points of each write. Reads follow Kubernetes' resourceVersion rules.
//! Both the gRPC resource API and the REST API call these methods, so the
//! two encodings share one behaviour. `pods/eviction`, the delete that
//! asks PodDisruptionBudgets first, is in [`eviction`].

mod eviction;

use std::collections::BTreeSet;

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use skiff_api::field::FieldError;
use skiff_api::managed_fields::{self, Manager, Writer};
use skiff_api::resources::{self, Kind, ResourceInfo};
use skiff_api::selector::{object_fields, FieldSelector, LabelSelector};
use skiff_api::structure;
use skiff_api::{defaults, meta, validation, ApiError};
use skiff_raft_store::types::{Compare, OpResult, Txn};
use skiff_raft_store::Store;

use crate::admission::{Attributes, Security, UserInfo};
use crate::crds::CustomResources;
use crate::storage::{
    self, absent, parse_resource_version, prefix_end, unchanged_since, Consistency, ObjectStore, Stored,
    MAX_OBJECT_BYTES,
};
use crate::strategy::{self, Claim, Strategy};
use crate::watch::{Fanout, Filter, WatchEvent, WatchOptions};
use crate::{limits, pod_security, priority, quota, service_account_admission};

/// Attempts of a read-modify-write before giving up on a busy object.
const UPDATE_ATTEMPTS: usize = 16;
/// Names tried for one `generateName` before answering AlreadyExists.
const GENERATE_ATTEMPTS: usize = 8;
/// Keys read from the store per step of a filtered list.
const LIST_STEP: i64 = 500;
/// Namespaces every cluster has.
pub const DEFAULT_NAMESPACES: [&str; 4] = ["default", "kube-system", "kube-public", "kube-node-lease"];

/// Who is asking, once authenticated.
#[derive(Clone, Debug)]
pub struct Context {
    pub user: UserInfo,
    /// The manager this request's writes are recorded under in
    /// `metadata.managedFields`: the `fieldManager` parameter, else derived
    /// from the client's User-Agent as Kubernetes derives it.
    pub field_manager: String,
    /// What the request should be warned of (`Warning` headers on the
    /// REST API): admission's warnings land here.
    pub warnings: Warnings,
    /// What admission says for the audit log (the event's `annotations`).
    pub audit: AuditAnnotations,
}

/// A request's warnings, shared by the layers that add them and the one
/// that answers.
pub type Warnings = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// A request's audit annotations (Kubernetes' `audit.Event.annotations`),
/// shared by the audit layer, which writes them out, and admission.
pub type AuditAnnotations = std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<String, String>>>;

impl Context {
    /// An internal caller (bootstrap tasks, tests).
    pub fn internal() -> Context {
        Context {
            user: UserInfo { name: "system:apiserver".into(), groups: vec!["system:masters".into()] },
            field_manager: "skiff-apiserver".into(),
            warnings: Warnings::default(),
            audit: AuditAnnotations::default(),
        }
    }

    /// Adds a warning for the caller, once (a write retried after a
    /// conflict passes admission again).
    pub fn warn(&self, warning: String) {
        let mut warnings = self.warnings.lock().expect("warnings lock");
        if !warnings.contains(&warning) {
            warnings.push(warning);
        }
    }

    /// Records `key: value` in the request's audit event.
    pub fn annotate_audit(&self, key: &str, value: String) {
        self.audit.lock().expect("audit annotations lock").insert(key.to_string(), value);
    }
}

/// The manager Kubernetes derives from a User-Agent when a request names
/// none: what precedes the first `/` (`kubectl/v1.32.4 (linux/amd64) …` is
/// `kubectl`), at most 128 characters; `unknown` without a User-Agent.
pub fn manager_from_user_agent(user_agent: &str) -> String {
    let prefix: String = user_agent.split('/').next().unwrap_or_default().chars().take(128).collect();
    if prefix.is_empty() {
        "unknown".to_string()
    } else {
        prefix
    }
}

/// How a write records its manager in `metadata.managedFields`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Record {
    /// As an Update by the request's manager (create, update, patch).
    Update,
    /// The change already recorded it (server-side apply).
    Done,
    /// Not at all (`pods/binding`, as Kubernetes).
    Skip,
}

#[derive(Clone, Debug, Default)]
pub struct ListOptions {
    pub label_selector: String,
    pub field_selector: String,
    pub limit: i64,
    pub continue_token: String,
    pub resource_version: String,
    pub resource_version_match: String,
}

/// A page of a list: items as stored bytes (resourceVersion included).
#[derive(Clone, Debug)]
pub struct ListResult {
    pub items: Vec<Vec<u8>>,
    pub resource_version: i64,
    pub continue_token: Option<String>,
    pub remaining_item_count: Option<i64>,
}

#[derive(Clone, Debug, Default)]
pub struct DeleteOptions {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub propagation_policy: Option<String>,
    pub grace_period_seconds: Option<i64>,
    pub dry_run: bool,
}

impl DeleteOptions {
    /// The options of a `meta/v1` DeleteOptions body (a delete's, or an
    /// Eviction's `deleteOptions`); anything else reads as none.
    pub fn from_body(body: &Value) -> DeleteOptions {
        let text = |v: &Value| v.as_str().filter(|s| !s.is_empty()).map(str::to_string);
        let policy = text(&body["propagationPolicy"]).or_else(|| match body["orphanDependents"].as_bool() {
            Some(true) => Some("Orphan".into()),
            _ => None,
        });
        DeleteOptions {
            uid: text(&body["preconditions"]["uid"]),
            resource_version: text(&body["preconditions"]["resourceVersion"]),
            propagation_policy: policy,
            grace_period_seconds: body["gracePeriodSeconds"].as_i64(),
            dry_run: body["dryRun"].as_array().is_some_and(|a| a.iter().any(|v| v == "All")),
        }
    }

    /// The preconditions (uid, resourceVersion) against `obj` of `info` as
    /// read at `version`: the Conflict a delete answers when one fails. A
    /// resourceVersion that is not a number is a Bad Request.
    pub fn check(&self, info: &ResourceInfo, obj: &Value, version: i64) -> Result<(), ApiError> {
        let name = meta::name(obj).unwrap_or_default();
        let uid = meta::uid(obj).unwrap_or_default();
        if let Some(wanted) = self.uid.as_deref().filter(|u| *u != uid) {
            let why = format!("Precondition failed: UID in precondition: {wanted}, UID in object meta: {uid}");
            return Err(ApiError::conflict(info, name, &why));
        }
        if let Some(wanted) = self.resource_version.as_deref() {
            if parse_resource_version(wanted)? != version {
                let why = format!(
                    "Precondition failed: ResourceVersion in precondition: {wanted}, ResourceVersion in object meta: {version}"
                );
                return Err(ApiError::conflict(info, name, &why));
            }
        }
        Ok(())
    }
}

/// What a delete did.
#[derive(Clone, Debug)]
pub enum Deleted {
    /// Gone from the store; the last state.
    Now(Value),
    /// Marked for deletion (finalizers or a grace period remain).
    Marked(Value),
}

impl Deleted {
    pub fn object(&self) -> &Value {
        match self {
            Deleted::Now(v) | Deleted::Marked(v) => v,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchType {
    Merge,
    Json,
    Strategic,
    /// Server-side apply (`application/apply-patch+yaml`).
    Apply,
}

impl PatchType {
    pub fn parse(s: &str) -> Result<PatchType, ApiError> {
        match s {
            "merge" | "application/merge-patch+json" => Ok(PatchType::Merge),
            "json" | "application/json-patch+json" => Ok(PatchType::Json),
            "strategic" | "application/strategic-merge-patch+json" => Ok(PatchType::Strategic),
            "apply" | "application/apply-patch+yaml" => Ok(PatchType::Apply),
            other => Err(ApiError::new(
                skiff_api::Reason::UnsupportedMediaType,
                format!(
                    "the patch type {other:?} is not supported; use \"merge\", \"json\", \"strategic\" or \"apply\""
                ),
            )),
        }
    }
}

/// Refuses an update or patch of a subresource the resource lacks (404)
/// or that is only ever created (`binding`, `token`, `eviction`: 405).
fn updatable_subresource(info: &ResourceInfo, name: &str, subresource: &str) -> Result<(), ApiError> {
    if !subresource.is_empty() && !info.has_subresource(subresource) {
        return Err(ApiError::not_found(info, &format!("{name}/{subresource}")));
    }
    if matches!(subresource, "binding" | "token" | "eviction") {
        return Err(ApiError::method_not_allowed(format!("{}/{subresource} can only be created", info.plural)));
    }
    Ok(())
}

/// How a patch is applied.
#[derive(Clone, Debug, Default)]
pub struct PatchOptions {
    pub dry_run: bool,
    /// `fieldValidation=Strict`: a patched object with fields its type does
    /// not have is refused (400) instead of having them dropped.
    pub strict_fields: bool,
    /// `fieldValidation=Warn`: the fields dropped are reported here.
    pub warnings: Option<std::sync::Arc<std::sync::Mutex<Vec<String>>>>,
    /// Server-side apply only: take the fields other managers own instead
    /// of failing with a conflict.
    pub force: bool,
}

/// The managers recorded before a write: those the new object carries if
/// the client set them (Kubernetes lets clients rewrite managedFields, and
/// kubectl does when it moves from client-side to server-side apply),
/// else the live object's. A subresource write never sets them.
fn managers_before(live: &Value, next: &Value, subresource: &str) -> Result<Vec<Manager>, ApiError> {
    if subresource.is_empty() {
        if let Some(supplied) =
            managed_fields::decode(next).map_err(|e| ApiError::bad_request(format!("invalid managedFields: {e}")))?
        {
            return Ok(supplied);
        }
    }
    // Unreadable live bookkeeping is dropped, as Kubernetes resets it.
    Ok(managed_fields::decode(live).ok().flatten().unwrap_or_default())
}

fn writer<'a>(
    info: &ResourceInfo,
    ctx: &'a Context,
    subresource: &'a str,
    api_version: &'a str,
    now: &'a str,
) -> Writer<'a> {
    Writer {
        manager: &ctx.field_manager,
        api_version,
        subresource,
        status_subresource: info.has_subresource("status"),
        now,
    }
}

/// Records an Update by the request's manager that turns `live` (`Null`
/// for a create) into `next`.
fn record_update(
    info: &ResourceInfo,
    ctx: &Context,
    subresource: &str,
    live: &Value,
    next: &mut Value,
) -> Result<(), ApiError> {
    let (now, api_version) = (meta::now_rfc3339(), info.api_version());
    let w = writer(info, ctx, subresource, &api_version, &now);
    fn managed(obj: &Value) -> Option<&Value> {
        obj.pointer("/metadata/managedFields").filter(|v| !v.is_null())
    }
    if !live.is_null() && (!subresource.is_empty() || managed(next).is_none() || managed(next) == managed(live)) {
        // The managers are those stored (a patch carries them over as they
        // are): read only those the write can change.
        managed_fields::update_stored(structure::of(info), live, next, &w);
        return Ok(());
    }
    let managers = managers_before(live, next, subresource)?;
    if live.is_null() && managers.is_empty() {
        managed_fields::record_create(structure::of(info), next, &w);
        return Ok(());
    }
    let managers = managed_fields::update(structure::of(info), live, next, managers, &w);
    managed_fields::encode(&managers, next);
    Ok(())
}

/// Every field of `original` that decoding into the Kubernetes type
/// dropped, as `spec.foo` paths: what strict field validation refuses.
pub fn unknown_fields(original: &Value, normalized: &Value, path: &str, out: &mut Vec<String>) {
    match (original, normalized) {
        (Value::Object(o), Value::Object(n)) => {
            for (k, v) in o {
                let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                match n.get(k) {
                    Some(nv) => unknown_fields(v, nv, &p, out),
                    // Nulls, and Secrets' stringData (folded into data), are not unknown.
                    None if v.is_null() || (path.is_empty() && k == "stringData") => {}
                    None => out.push(p),
                }
            }
        }
        (Value::Array(o), Value::Array(n)) => {
            for (i, (ov, nv)) in o.iter().zip(n).enumerate() {
                unknown_fields(ov, nv, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// One entry of an object's history.
#[derive(Clone, Debug)]
pub struct HistoryEntry {
    pub revision: i64,
    /// ADDED, MODIFIED or DELETED.
    pub event: &'static str,
    pub commit_time_ms: u64,
    pub object: Value,
    pub summary: String,
}

#[derive(Serialize, Deserialize)]
struct ContinueToken {
    rv: i64,
    start: String,
}

fn encode_continue(rv: i64, start: &[u8]) -> String {
    let token = ContinueToken { rv, start: String::from_utf8_lossy(start).into_owned() };
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(serde_json::to_vec(&token).expect("token serializes"))
}

fn decode_continue(token: &str, prefix: &str) -> Result<ContinueToken, ApiError> {
    let bad = || ApiError::bad_request(format!("continue key is not valid: {token:?}"));
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token).map_err(|_| bad())?;
    let t: ContinueToken = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    if !t.start.starts_with(prefix) || t.rv <= 0 {
        return Err(bad());
    }
    Ok(t)
}

fn random_suffix() -> String {
    use rand::Rng;
    // Kubernetes' alphabet: no vowels, no confusable digits.
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::thread_rng();
    (0..5).map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char).collect()
}

fn not_found(info: &ResourceInfo, name: &str) -> ApiError {
    ApiError::not_found(info, name)
}

fn size_check(bytes: &[u8]) -> Result<(), ApiError> {
    if bytes.len() > MAX_OBJECT_BYTES {
        return Err(ApiError::too_large(format!(
            "object is too large: {} bytes, the limit is {MAX_OBJECT_BYTES} bytes",
            bytes.len()
        )));
    }
    Ok(())
}

#[derive(Clone)]
pub struct Registry {
    objects: ObjectStore,
    security: Security,
    fanout: Fanout,
    custom: CustomResources,
}

impl Registry {
    pub fn new(objects: ObjectStore, security: Security, fanout: Fanout) -> Registry {
        Registry { objects, security, fanout, custom: CustomResources::default() }
    }

    /// The resource served at `group`/`version` under `plural`, built-in
    /// or added by a CustomResourceDefinition.
    pub async fn resource(
        &self,
        group: &str,
        version: &str,
        plural: &str,
    ) -> Result<Option<&'static ResourceInfo>, ApiError> {
        self.custom.find(&self.objects, group, version, plural).await
    }

    /// Every resource CustomResourceDefinitions add, for discovery.
    pub async fn custom_resources(&self) -> Result<Vec<&'static ResourceInfo>, ApiError> {
        self.custom.all(&self.objects).await
    }

    pub fn store(&self) -> &Store {
        &self.objects.store
    }

    pub fn security(&self) -> &Security {
        &self.security
    }

    pub fn fanout(&self) -> &Fanout {
        &self.fanout
    }

    /// The namespace a request is about: required for namespaced resources,
    /// ignored for cluster-scoped ones.
    fn scope<'a>(&self, info: &ResourceInfo, namespace: &'a str) -> Result<Option<&'a str>, ApiError> {
        if !info.namespaced {
            return Ok(None);
        }
        if namespace.is_empty() {
            return Err(ApiError::bad_request(format!("a namespace is required for {}", info.qualified())));
        }
        Ok(Some(namespace))
    }

    fn authorize(
        &self,
        ctx: &Context,
        verb: &str,
        info: &'static ResourceInfo,
        subresource: &str,
        namespace: &str,
        name: &str,
    ) -> Result<(), ApiError> {
        self.security.authorize(&Attributes { user: &ctx.user, verb, resource: info, subresource, namespace, name })
    }

    // ------------------------------------------------------------------ reads

    pub async fn get(
        &self,
        ctx: &Context,
        info: &'static ResourceInfo,
        namespace: &str,
        name: &str,
        resource_version: &str,
    ) -> Result<Value, ApiError> {
        self.authorize(ctx, "get", info, "", namespace, name)?;
        let ns = self.scope(info, namespace)?;
        let consistency = Consistency::parse(resource_version, "")?;
        let at = self.objects.prepare_read(consistency).await?;
        let (found, _) = self.objects.get(&info.key(ns, name), at).await?;
        found.ok_or_else(|| not_found(info, name))?.decode()
    }

    /// Brings this member up to every acknowledged write (after a local
    /// read turned out stale). Always `true`: the state is fresh now.
    async fn refresh(&self) -> Result<bool, ApiError> {
        self.objects.prepare_read(Consistency::Linearizable).await?;
        Ok(true)
    }

    /// Reads an object without authorization (the registry's own use).
    async fn current(&self, info: &ResourceInfo, ns: Option<&str>, name: &str) -> Result<Option<Stored>, ApiError> {
        Ok(self.objects.get(&info.key(ns, name), 0).await?.0)
    }

    pub async fn list(
        &self,
        ctx: &Context,
        info: &'static ResourceInfo,
        namespace: &str,
        opts: &ListOptions,
    ) -> Result<ListResult, ApiError> {
        self.authorize(ctx, "list", info, "", namespace, "")?;
        let (labels, fields) = selectors(info, &opts.label_selector, &opts.field_selector)?;
        if opts.limit < 0 {
            return Err(ApiError::bad_request("limit must not be negative"));
        }
        let ns = if info.namespaced && !namespace.is_empty() { Some(namespace) } else { None };
        let prefix = info.namespace_prefix(ns);
        let end = prefix_end(prefix.as_bytes());

        let (mut start, at) = if opts.continue_token.is_empty() {
            let consistency = Consistency::parse(&opts.resource_version, &opts.resource_version_match)?;
            (prefix.as_bytes().to_vec(), self.objects.prepare_read(consistency).await?)
        } else {
            let token = decode_continue(&opts.continue_token, &prefix)?;
            (token.start.into_bytes(), token.rv)
        };
        let filtered = !labels.is_empty() || !fields.is_empty();
        let mut items = Vec::new();
        let mut revision = at;
        loop {
            let want = if opts.limit > 0 { (opts.limit - items.len() as i64).max(1) } else { 0 };
            let step = if filtered && want > 0 { want.max(LIST_STEP) } else { want };
            let page = match self.objects.range(&start, &end, revision, step).await {
                Err(e) if e.reason == skiff_api::Reason::Expired && !opts.continue_token.is_empty() => {
                    return Err(ApiError::expired(
                        "The provided continue parameter is too old to display a consistent list result. \
                         You can start a new list without the continue parameter.",
                    ))
                }
                other => other?,
            };
            revision = page.revision;
            let fetched = page.items.len();
            let mut last_key = None;
            let mut stopped_early = false;
            for stored in page.items {
                if opts.limit > 0 && items.len() as i64 >= opts.limit {
                    stopped_early = true;
                    break;
                }
                last_key = Some(stored.key.clone());
                if filtered {
                    let obj = stored.decode()?;
                    if !labels.matches(&meta::labels(&obj)) || !fields.matches(&object_fields(info.kind_id, &obj)) {
                        continue;
                    }
                }
                items.push(stored.json);
            }
            let more = page.more || stopped_early;
            let full = opts.limit > 0 && items.len() as i64 >= opts.limit;
            if !more || fetched == 0 {
                return Ok(ListResult {
                    items,
                    resource_version: revision,
                    continue_token: None,
                    remaining_item_count: None,
                });
            }
            let mut next = last_key.unwrap_or_default();
            next.push(0);
            if full {
                let remaining =
                    if filtered { None } else { Some((page.count - fetched as i64).max(0) + (stopped_early as i64)) };
                return Ok(ListResult {
                    items,
                    resource_version: revision,
                    continue_token: Some(encode_continue(revision, &next)),
                    remaining_item_count: remaining.filter(|r| *r > 0),
                });
            }
            start = next;
        }
    }

    // ----------------------------------------------------------------- writes

    /// Decodes `obj` into the normalized form of `info`'s kind.
    fn normalize(&self, info: &ResourceInfo, obj: &Value) -> Result<Value, ApiError> {
        if !obj.is_object() {
            return Err(ApiError::bad_request(format!("the body of a {} must be a JSON object", info.kind)));
        }
        if let Some(v) = obj.get("apiVersion").and_then(Value::as_str) {
            if v != info.api_version() {
                return Err(ApiError::bad_request(format!(
                    "the API version in the data ({v}) does not match the expected API version ({})",
                    info.api_version()
                )));
            }
        }
        if let Some(k) = obj.get("kind").and_then(Value::as_str) {
            if k != info.kind {
                return Err(ApiError::bad_request(format!(
                    "the kind in the data ({k}) does not match the expected kind ({})",
                    info.kind
                )));
            }
        }
        validation::normalize(info, obj).map_err(|e| ApiError::bad_request(format!("invalid {}: {e}", info.kind)))
    }

    fn check_valid(&self, info: &ResourceInfo, obj: &Value, errors: Vec<FieldError>) -> Result<(), ApiError> {
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ApiError::invalid(info, meta::name(obj).unwrap_or_default(), &errors))
        }
    }

    /// NamespaceLifecycle: a namespaced object may only be created in a
    /// namespace that exists and is not terminating. Returns the compare
    /// that makes this hold atomically with the write.
    async fn namespace_guard(&self, info: &ResourceInfo, ns: &str, name: &str) -> Result<Compare, ApiError> {
        let namespaces = resources::of(Kind::Namespace);
        let key = namespaces.key(None, ns);
        let mut found = self.objects.get(&key, 0).await?.0;
        if found.is_none() {
            // Maybe created through another master and not applied here yet.
            self.objects.prepare_read(Consistency::Linearizable).await?;
            found = self.objects.get(&key, 0).await?.0;
        }
        let Some(stored) = found else {
            return Err(not_found(namespaces, ns));
        };
        let obj = stored.decode()?;
        if meta::deletion_timestamp(&obj).is_some() || obj["status"]["phase"] == "Terminating" {
            return Err(ApiError::forbidden(format!(
                "{} \"{name}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                info.qualified()
            )));
        }
        Ok(unchanged_since(&key, stored.mod_revision))
    }

    pub async fn create(
        &self,
        ctx: &Context,
        info: &'static ResourceInfo,
        namespace: &str,
        obj: Value,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        self.create_with(ctx, info, namespace, obj, dry_run, None).await
    }

    /// Creates an object; `applied` are its managers when a server-side
    /// apply creates it, else the create is recorded as an Update.
    async fn create_with(
        &self,
        ctx: &Context,
        info: &'static ResourceInfo,
        namespace: &str,
        obj: Value,
        dry_run: bool,
        applied: Option<Vec<Manager>>,
    ) -> Result<Value, ApiError> {
        let strategy = strategy::of(info.kind_id);
        let mut obj = self.normalize(info, &obj)?;
        let recorded = applied.is_some();
        let supplied = match applied {
            Some(managers) => managers,
            None => managers_before(&Value::Null, &obj, "")?,
        };
        let ns = if info.namespaced {
            let body_ns = meta::namespace(&obj).unwrap_or_default().to_string();
            let ns = match (namespace, body_ns.as_str()) {
                ("", "") => "default".to_string(),
                ("", b) => b.to_string(),
                (n, "") => n.to_string(),
                (n, b) if n == b => n.to_string(),
                _ => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ))
                }
            };
            meta::set_str(&mut obj, "namespace", &ns);
            Some(ns)
        } else {
            meta::meta_mut(&mut obj).remove("namespace");
            None
        };
        let ns_str = ns.as_deref().unwrap_or("");
        let name = meta::name(&obj).unwrap_or_default().to_string();
        self.authorize(ctx, "create", info, "", ns_str, &name)?;
        if meta::resource_version(&obj).is_some() {
            return Err(ApiError::bad_request("resourceVersion should not be set on objects to be created"));
        }
        let generate = meta::generate_name(&obj).map(str::to_string);
        if name.is_empty() && generate.is_none() {
            return Err(ApiError::invalid(
                info,
                "",
                &[FieldError::required("metadata.name", "name or generateName is required")],
            ));
        }

        // Server-set metadata.
        {
            let m = meta::meta_mut(&mut obj);
            m.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
            m.insert("creationTimestamp".into(), json!(meta::now_rfc3339()));
            m.remove("deletionTimestamp");
            m.remove("deletionGracePeriodSeconds");
            m.remove("generation");
            m.remove("managedFields");
            if strategy.tracks_generation() {
                m.insert("generation".into(), json!(1));
            }
        }
        strategy.prepare_for_create(info, &mut obj);
        let attrs = Attributes {
            user: &ctx.user,
            verb: "create",
            resource: info,
            subresource: "",
            namespace: ns_str,
            name: &name,
        };
        priority::admit(&self.objects, &attrs, &mut obj, None).await?;
        if self.security.tokens().is_some() {
            service_account_admission::admit(&self.objects, &attrs, &mut obj, &random_suffix()).await?;
        }
        let limit_ranges = limits::ranges_for(&self.objects, &attrs).await?;

        // A generated name that is taken is generated again, a few times.
        let generated = generate.is_some() && name.is_empty();
        let mut name_attempts = 0;
        // The revision an attempt failed at: the next reads the quotas at
        // least there, so it sees the charge that beat it.
        let mut failed_at = 0;
        for _ in 0..UPDATE_ATTEMPTS {
            let mut candidate = obj.clone();
            let name = if name.is_empty() {
                let n = format!("{}{}", generate.as_deref().unwrap_or_default(), random_suffix());
                meta::set_str(&mut candidate, "name", &n);
                n
            } else {
                name.clone()
            };
            // Defaulting labels a Namespace with its name, generated or not.
            defaults::apply(info, &mut candidate);
            let attrs = Attributes {
                user: &ctx.user,
                verb: "create",
                resource: info,
                subresource: "",
                namespace: ns_str,
                name: &name,
            };
            limits::admit(&attrs, &mut candidate, &limit_ranges)?;
            if let Some(tokens) = self.security.tokens() {
                service_account_admission::fill_token_secret(&self.objects, tokens, &attrs, &mut candidate).await?;
            }
            self.security.admit(&attrs, &mut candidate, None)?;
            pod_security::admit(&self.objects, ctx, &attrs, &candidate, None).await?;
            let chosen = strategy.allocate(&mut candidate, None).map_err(|e| ApiError::invalid(info, &name, &[e]))?;
            if recorded {
                managed_fields::encode(&supplied, &mut candidate);
            } else {
                let (now, api_version) = (meta::now_rfc3339(), info.api_version());
                let w = writer(info, ctx, "", &api_version, &now);
                if supplied.is_empty() {
                    managed_fields::record_create(structure::of(info), &mut candidate, &w);
                } else {
                    let managers =
                        managed_fields::update(structure::of(info), &Value::Null, &candidate, supplied.clone(), &w);
                    managed_fields::encode(&managers, &mut candidate);
                }
            }
            self.check_valid(info, &candidate, strategy.validate_create(info, &candidate))?;
            let bytes = storage::encode(&candidate);
            size_check(&bytes)?;
            let charges = quota::charge(&self.objects, &attrs, &candidate, failed_at).await?;
            if dry_run {
                return Ok(candidate);
            }

            let key = info.key(ns.as_deref(), &name);
            let mut compare = vec![absent(&key)];
            if let Some(ns) = &ns {
                compare.push(self.namespace_guard(info, ns, &name).await?);
            }
            let mut success = vec![storage::put(&key, bytes.clone())];
            let allocations = strategy.held(&candidate);
            for a in &allocations {
                compare.push(absent(a));
                success.push(storage::put(a, key.clone().into_bytes()));
            }
            for charge in &charges {
                compare.push(unchanged_since(&charge.key, charge.mod_revision));
                success.push(storage::put(&charge.key, storage::encode(&charge.quota)));
            }
            let failure =
                std::iter::once(storage::get_op(&key)).chain(allocations.iter().map(|a| storage::get_op(a))).collect();
            let (ok, responses, revision) = self.objects.txn(Txn { compare, success, failure }).await?;
            if ok {
                meta::set_resource_version(&mut candidate, revision);
                return Ok(candidate);
            }
            failed_at = revision;
            let exists = |i: usize| matches!(responses.get(i), Some(OpResult::Range(r)) if !r.kvs.is_empty());
            if exists(0) {
                name_attempts += 1;
                if generated && name_attempts < GENERATE_ATTEMPTS {
                    continue;
                }
                return Err(ApiError::already_exists(info, &name));
            }
            for (i, a) in allocations.iter().enumerate() {
                if exists(i + 1) {
                    if let Some(claim) = chosen.iter().find(|c| &c.key == a) {
                        return Err(ApiError::invalid(info, &name, std::slice::from_ref(&claim.taken)));
                    }
                }
            }
            // The namespace or a quota changed, or a random allocation
            // collided: again.
        }
        Err(ApiError::unavailable(format!("{} could not be created: too much contention", info.qualified())))
    }

    /// Replaces an object (`subresource` ""), its status ("status") or a
    /// namespace's spec.finalizers ("finalize").
    // The request as Kubernetes names it: resource, namespace, name, body, subresource, dry run.
    #[allow(clippy::too_many_arguments)]
    pub async fn update(
        &self,
        ctx: &Context,
        info: &'static ResourceInfo,
        namespace: &str,
        name: &str,
        obj: Value,
        subresource: &str,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        let ns = self.scope(info, namespace)?;
        let ns_str = ns.unwrap_or("");
        self.authorize(ctx, "update", info, subresource, ns_str, name)?;
        updatable_subresource(info, name, subresource)?;
        if subresource == "scale" {
            return self.update_scale(ctx, info, ns, name, obj, dry_run).await;
        }
        let body = self.normalize(info, &obj)?;
        if let Some(n) = meta::name(&body) {
            if n != name {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                )));
            }
        }
        if let (Some(ns), Some(b)) = (ns, meta::namespace(&body)) {
            if ns != b {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
        }
        let precondition = meta::resource_version(&body).map(parse_resource_version).transpose()?;
        let owned = subresource.to_string();
        self.read_modify_write(
            ctx,
            info,
            ns,
            name,
            precondition,
            dry_run,
            "update",
            subresource,
            Record::Update,
            move |current| Ok(merge_update(info, current, &body, &owned)),
        )
        .await
    }

    // The request as Kubernetes names it: resource, namespace, name, body, subresource, dry run.
    #[allow(clippy::too_many_arguments)]
    pub async fn patch(
        &self,
        ctx: &Context,
        info: &'static ResourceInfo,
        namespace: &str,
        name: &str,
        patch_type: PatchType,
        patch: &[u8],
        subresource: &str,
        opts: PatchOptions,
    ) -> Result<Value, ApiError> {
        let dry_run = opts.dry_run;
        let ns = self.scope(info, namespace)?;
        self.authorize(ctx, "patch", info, subresource, ns.unwrap_or(""), name)?;
        updatable_subresource(info, name, subresource)?;
        if patch_type == PatchType::Apply {
            return Ok(self.apply_scoped(ctx, info, ns, name, patch, subresource, opts).await?.0);
        }
        if opts.force {
            return Err(ApiError::bad_request("force: Forbidden: may not be specified for non-apply patch"));
        }
        if patch_type == PatchType::Strategic && info.kind_id == Kind::Custom {
            // Custom resources have no patch strategies: Kubernetes refuses.
            return Err(ApiError::new(
                skiff_api::Reason::UnsupportedMediaType,
                "the body of the request was in an unknown format - accepted media types include: \
                 application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
            ));
        }
        let patch: Value = serde_json::from_slice(patch)
            .map_err(|e| ApiError::bad_request(format!("the patch is not valid JSON: {e}")))?;
        let apply_patch = move |doc: &Value| -> Result<Value, ApiError> {
            match patch_type {
                PatchType::Merge => {
                    if !patch.is_object() {
                        return Err(ApiError::bad_request("a merge patch must be a JSON object"));
                    }
                    let mut doc = doc.clone();
                    json_patch::merge(&mut doc, &patch);
                    Ok(doc)
                }
                PatchType::Json => {
                    let ops: json_patch::Patch = serde_json::from_value(patch.clone())
                        .map_err(|e| ApiError::bad_request(format!("the JSON patch is not valid: {e}")))?;
                    let mut doc = doc.clone();
                    json_patch::patch(&mut doc, &ops).map_err(|e| {
                        ApiError::new(skiff_api::Reason::Invalid, format!("the JSON patch could not be applied: {e}"))
                    })?;
                    Ok(doc)
                }
                PatchType::Strategic => skiff_api::patch::strategic_merge(info.kind_id, doc, &patch)
                    .map_err(|e| ApiError::bad_request(format!("the strategic merge patch could not be applied: {e}"))),
                PatchType::Apply => Err(ApiError::bad_request("an apply patch is not a patch of a document")),
            }
        };
        if subresource == "scale" {
            let current = self.get_scale(ctx, info, ns.unwrap_or(""), name).await?;
            let patched = apply_patch(&current)?;
            return self.update_scale(ctx, info, ns, name, patched, dry_run).await;
        }
        // A patch naming a resourceVersion is a precondition on it.
        let owned = subresource.to_string();
        self.read_modify_write(
            ctx,
            info,
            ns,
            name,
            None,
            dry_run,
            "patch",
            subresource,
            Record::Update,
            move |current| {
                let patched = apply_patch(current)?;
                finish_patch(info, current, patched, &opts, &owned)
            },
        )
        .await
    }

    /// Server-side apply of `config` (YAML or JSON) by the request's
    /// manager: merged into the live object, or creating it. The flag says
    /// whether it was created.
    #[allow(clippy::too_many_arguments)]
    pub async fn apply(
        &self,
        ctx: &Context,
        info: &'static ResourceInfo,
        namespace: &str,
        name: &str,
        config: &[u8],
        subresource: &str,
        opts: PatchOptions,
    ) -> Result<(Value, bool), ApiError> {
        let ns = self.scope(info, namespace)?;
        self.authorize(ctx, "patch", info, subresource, ns.unwrap_or(""), name)?;
        updatable_subresource(info, name, subresource)?;
        self.apply_scoped(ctx, info, ns, name, config, subresource, opts).await
    }

    #[allow(clippy::too_many_arguments)]
    async fn apply_scoped(
        &self,
        ctx: &Context,
        info: &'static ResourceInfo,
        ns: Option<&str>,
        name: &str,
        config: &[u8],
        subresource: &str,
        opts: PatchOptions,
    ) -> Result<(Value, bool), ApiError> {
        let mut config: Value = serde_yaml::from_slice(config)
            .map_err(|e| ApiError::bad_request(format!("the apply configuration is not valid YAML or JSON: {e}")))?;
        if !config.is_object() {
            return Err(ApiError::bad_request("the apply configuration must be an object"));
        }
        let text = |k: &str| config.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
        if text("apiVersion") != info.api_version() || text("kind") != info.kind {
            return Err(ApiError::bad_request(format!(
                "the apply configuration must have apiVersion {:?} and kind {:?}, not {:?} and {:?}",
                info.api_version(),
                info.kind,
                text("apiVersion"),
                text("kind")
            )));
        }
        match meta::name(&config) {
            Some(n) if n != name => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                )))
            }
            Some(_) => {}
            None => meta::set_str(&mut config, "name", name),
        }
        if let (Some(ns), Some(b)) = (ns, meta::namespace(&config)) {
            if ns != b {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
        }
        if config["metadata"].get("managedFields").is_some_and(|m| !m.is_null()) {
            return Err(ApiError::bad_request("metadata.managedFields must be nil"));
        }
        let precondition = meta::resource_version(&config).map(parse_resource_version).transpose()?;
        let (dry_run, force) = (opts.dry_run, opts.force);
        let api_version = info.api_version();
        for _ in 0..UPDATE_ATTEMPTS {
            let now = meta::now_rfc3339();
            let w = writer(info, ctx, subresource, &api_version, &now);
            let owned = subresource.to_string();
            let updated = self
                .read_modify_write(
                    ctx,
                    info,
                    ns,
                    name,
                    precondition,
                    dry_run,
                    "patch",
                    subresource,
                    Record::Done,
                    |current| {
                        let managers = managers_before(current, &Value::Null, "")?;
                        let (mut merged, managers) =
                            managed_fields::apply(structure::of(info), current, &config, managers, &w, force)?;
                        managed_fields::encode(&managers, &mut merged);
                        let mut next = finish_patch(info, current, merged, &opts, &owned)?;
                        // A subresource write keeps the live managedFields: put the new ones back.
                        managed_fields::encode(&managers, &mut next);
                        Ok(next)
                    },
                )
                .await;
            match updated {
                Err(e) if e.reason == skiff_api::Reason::NotFound && subresource.is_empty() => {}
                other => return other.map(|v| (v, false)),
            }
            if precondition.is_some() {
                return Err(not_found(info, name));
            }
            let (mut obj, managers) =
                managed_fields::apply(structure::of(info), &Value::Null, &config, Vec::new(), &w, force)?;
            meta::meta_mut(&mut obj).remove("resourceVersion");
            match self.create_with(ctx, info, ns.unwrap_or(""), obj, dry_run, Some(managers)).await {
                Err(e) if e.reason == skiff_api::Reason::AlreadyExists => continue,
                other => return other.map(|v| (v, true)),
            }
        }
        Err(ApiError::conflict(info, name, "too many concurrent writers; try again"))
    }
}

/// The end of every patch: the patched document decoded into its type
/// (unknown fields refused or reported per `fieldValidation`), then laid
/// over the live object as an update is.
fn finish_patch(
    info: &'static ResourceInfo,
    current: &Value,
    mut patched: Value,
    opts: &PatchOptions,
    subresource: &str,
) -> Result<Value, ApiError> {
    if let Some(rv) = meta::resource_version(&patched) {
        if Some(rv) != meta::resource_version(current) {
            return Err(ApiError::conflict(
                info,
                meta::name(current).unwrap_or_default(),
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
    }
    let report_unknown = opts.strict_fields || opts.warnings.is_some();
    if subresource == "status"
        && !report_unknown
        && info.kind_id != Kind::Custom
        && patched.get("spec") == current.get("spec")
    {
        // A status write keeps the stored spec (`merge_update`), and this
        // one left it as stored: decoding it again would change nothing.
        if let Some(m) = patched.as_object_mut() {
            m.remove("spec");
        }
    }
    let normalized = validation::normalize(info, &patched)
        .map_err(|e| ApiError::bad_request(format!("invalid {} after patching: {e}", info.kind)))?;
    if report_unknown {
        let mut unknown = Vec::new();
        unknown_fields(&patched, &normalized, "", &mut unknown);
        let list: Vec<String> = unknown.iter().map(|f| format!("unknown field \"{f}\"")).collect();
        if opts.strict_fields && !list.is_empty() {
            return Err(ApiError::bad_request(format!("strict decoding error: {}", list.join(", "))));
        }
        if let Some(sink) = &opts.warnings {
            // This attempt's findings replace an earlier attempt's.
            *sink.lock().expect("warnings lock") = list;
        }
    }
    let patched = normalized;
    if meta::name(&patched) != meta::name(current) {
        return Err(ApiError::bad_request("a patch may not change the name of the object"));
    }
    Ok(merge_update(info, current, &patched, subresource))
}

impl Registry {
    /// The optimistic loop shared by update and patch: read the object,
    /// compute the new one, write it if nobody wrote in between.
    #[allow(clippy::too_many_arguments)]
    async fn read_modify_write(
        &self,
        ctx: &Context,
        info: &'static ResourceInfo,
        ns: Option<&str>,
        name: &str,
        precondition: Option<i64>,
        dry_run: bool,
        verb: &str,
        subresource: &str,
        record: Record,
        change: impl Fn(&Value) -> Result<Value, ApiError>,
    ) -> Result<Value, ApiError> {
        let strategy = strategy::of(info.kind_id);
        let key = info.key(ns, name);
        if let Some(rv) = precondition {
            // Make sure the version the client saw is visible here.
            storage::wait_for_revision(&self.objects.store, rv).await?;
        }
        // The first attempt reads this member's state, which may trail the
        // leader; anything that goes wrong on it is retried on a fresh read.
        let mut fresh = false;
        for _ in 0..UPDATE_ATTEMPTS {
            let Some(stored) = self.current(info, ns, name).await? else {
                if fresh {
                    return Err(not_found(info, name));
                }
                fresh = self.refresh().await?;
                continue;
            };
            if let Some(rv) = precondition {
                if rv != stored.mod_revision {
                    if !fresh {
                        fresh = self.refresh().await?;
                        continue;
                    }
                    return Err(ApiError::conflict(
                        info,
                        name,
                        "the object has been modified; please apply your changes to the latest version and try again",
                    ));
                }
            }
            let current = stored.decode()?;
            let mut next = match change(&current) {
                Ok(next) => next,
                Err(_) if !fresh => {
                    fresh = self.refresh().await?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if strategy.tracks_generation() && meta::spec_part(&next) != meta::spec_part(&current) {
                next["metadata"]["generation"] = json!(meta::generation(&current) + 1);
            }
            let attrs =
                Attributes { user: &ctx.user, verb, resource: info, subresource, namespace: ns.unwrap_or(""), name };
            priority::admit(&self.objects, &attrs, &mut next, Some(&current)).await?;
            defaults::apply(info, &mut next);
            self.security.admit(&attrs, &mut next, Some(&current))?;
            pod_security::admit(&self.objects, ctx, &attrs, &next, Some(&current)).await?;
            let chosen =
                strategy.allocate(&mut next, Some(&current)).map_err(|e| ApiError::invalid(info, name, &[e]))?;
            if record == Record::Update {
                record_update(info, ctx, subresource, &current, &mut next)?;
            }
            self.check_valid(info, &next, strategy.validate_update(info, &next, &current, subresource))?;
            meta::set_resource_version(&mut next, stored.mod_revision);
            if next == current && !stored.stale {
                // Nothing to write, but only a fresh read can say so: on a
                // trailing read the change may undo a newer write. (An
                // object under an old encryption key is written again.)
                if !fresh {
                    fresh = self.refresh().await?;
                    continue;
                }
                return Ok(current);
            }
            let bytes = storage::encode(&next);
            size_check(&bytes)?;
            if dry_run {
                return Ok(next);
            }
            let finished = meta::deletion_timestamp(&next).is_some()
                && meta::finalizers(&next).is_empty()
                && !strategy.finalizing(&next)
                && next["metadata"]["deletionGracePeriodSeconds"].as_i64().unwrap_or(0) == 0;
            if finished {
                // The last finalizer is gone: the delete completes now.
                match self.remove(info, strategy, &key, &stored, &current).await? {
                    Some(revision) => {
                        meta::set_resource_version(&mut next, revision);
                        return Ok(next);
                    }
                    None if precondition.is_some() => return Err(ApiError::conflict(
                        info,
                        name,
                        "the object has been modified; please apply your changes to the latest version and try again",
                    )),
                    None => {
                        fresh = self.refresh().await?;
                        continue;
                    }
                }
            }
            let mut compare = vec![unchanged_since(&key, stored.mod_revision)];
            let mut success = vec![storage::put(&key, bytes)];
            let (old, new): (BTreeSet<String>, BTreeSet<String>) =
                (strategy.held(&current).into_iter().collect(), strategy.held(&next).into_iter().collect());
            for k in new.difference(&old) {
                compare.push(absent(k));
                success.push(storage::put(k, key.clone().into_bytes()));
            }
            for k in old.difference(&new) {
                success.push(storage::delete(k));
            }
            let (ok, _, revision) = self.objects.txn(Txn { compare, success, failure: vec![] }).await?;
            if ok {
                meta::set_resource_version(&mut next, revision);
                return Ok(next);
            }
            if precondition.is_some() {
                return Err(ApiError::conflict(
                    info,
                    name,
                    "the object has been modified; please apply your changes to the latest version and try again",
                ));
            }
            fresh = self.refresh().await?;
            if let Some(claim) = self.claim_taken(strategy, &current, &chosen).await? {
                return Err(ApiError::invalid(info, name, std::slice::from_ref(&claim.taken)));
            }
        }
        Err(ApiError::conflict(info, name, "too many concurrent writers; try again"))
    }

    /// The first of the user's `chosen` keys that `current` did not hold
    /// and someone else holds now: what an update that lost its compare
    /// may have lost it on.
    async fn claim_taken<'a>(
        &self,
        strategy: &dyn Strategy,
        current: &Value,
        chosen: &'a [Claim],
    ) -> Result<Option<&'a Claim>, ApiError> {
        let held = strategy.held(current);
        for claim in chosen.iter().filter(|c| !held.contains(&c.key)) {
            if self.objects.get(&claim.key, 0).await?.0.is_some() {
                return Ok(Some(claim));
            }
        }
        Ok(None)
    }

    /// Deletes `key` if it is still at `stored`'s revision, releasing the
    /// keys the object held. `None`: it changed in between. A namespace
    /// takes the custom resources left in it along (the namespace
    /// controller empties it of built-in kinds only).
    async fn remove(
        &self,
        info: &ResourceInfo,
        strategy: &dyn Strategy,
        key: &str,
        stored: &Stored,
        current: &Value,
    ) -> Result<Option<i64>, ApiError> {
        let mut success = vec![storage::delete(key)];
        success.extend(strategy.held(current).iter().map(|k| storage::delete(k)));
        success.extend(strategy.owned_prefixes(current).iter().map(|p| storage::delete_prefix(p)));
        if info.kind_id == Kind::Namespace {
            let ns = meta::name(current).unwrap_or_default();
            let prefixes: BTreeSet<String> = self
                .custom
                .all(&self.objects)
                .await?
                .into_iter()
                .filter(|r| r.namespaced && !ns.is_empty())
                .map(|r| r.namespace_prefix(Some(ns)))
                .collect();
            success.extend(prefixes.iter().map(|p| storage::delete_prefix(p)));
        }
        let txn = Txn { compare: vec![unchanged_since(key, stored.mod_revision)], success, failure: vec![] };
        let (ok, _, revision) = self.objects.txn(txn).await?;
        Ok(ok.then_some(revision))
    }

    pub async fn delete(
        &self,
        ctx: &Context,
        info: &'static ResourceInfo,
        namespace: &str,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<Deleted, ApiError> {
        let ns = self.scope(info, namespace)?;
        self.authorize(ctx, "delete", info, "", ns.unwrap_or(""), name)?;
        self.delete_unchecked(ctx, info, ns.unwrap_or(""), name, opts).await
    }

    /// A delete the caller has authorized (an eviction is allowed by
    /// `pods/eviction`, not by `delete` on pods).
    async fn delete_unchecked(
        &self,
        ctx: &Context,
        info: &'static ResourceInfo,
        namespace: &str,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<Deleted, ApiError> {
        let ns = self.scope(info, namespace)?;
        let strategy = strategy::of(info.kind_id);
        let key = info.key(ns, name);
        let policy = opts.propagation_policy.as_deref().unwrap_or("");
        if !matches!(policy, "" | "Background" | "Foreground" | "Orphan") {
            return Err(ApiError::invalid(
                info,
                name,
                &[FieldError::not_supported(
                    "propagationPolicy",
                    &json!(policy),
                    &["Foreground", "Background", "Orphan"],
                )],
            ));
        }
        if opts.grace_period_seconds.is_some_and(|g| g < 0) {
            return Err(ApiError::invalid(
                info,
                name,
                &[FieldError::invalid("gracePeriodSeconds", &json!(opts.grace_period_seconds), "must be >= 0")],
            ));
        }
        // As in read_modify_write: the first read is this member's, which
        // may trail the leader, so a failed precondition is checked again
        // on a fresh read before it is reported.
        let mut fresh = false;
        for _ in 0..UPDATE_ATTEMPTS {
            let Some(stored) = self.current(info, ns, name).await? else {
                if fresh {
                    return Err(not_found(info, name));
                }
                fresh = self.refresh().await?;
                continue;
            };
            let current = stored.decode()?;
            if let Err(e) = opts.check(info, &current, stored.mod_revision) {
                if fresh || e.reason != skiff_api::Reason::Conflict {
                    return Err(e);
                }
                fresh = self.refresh().await?;
                continue;
            }
            let attrs = Attributes {
                user: &ctx.user,
                verb: "delete",
                resource: info,
                subresource: "",
                namespace: ns.unwrap_or(""),
                name,
            };
            let mut probe = current.clone();
            priority::admit(&self.objects, &attrs, &mut probe, Some(&current)).await?;
            self.security.admit(&attrs, &mut probe, Some(&current))?;

            let mut next = current.clone();
            let mut finalizers = meta::finalizers(&next);
            let add = |f: &mut Vec<String>, v: &str| {
                if !f.iter().any(|x| x == v) {
                    f.push(v.to_string());
                }
            };
            match policy {
                "Orphan" => add(&mut finalizers, "orphan"),
                "Foreground" => add(&mut finalizers, "foregroundDeletion"),
                _ => {}
            }
            meta::set_finalizers(&mut next, &finalizers);
            let grace = strategy.grace_period(&current, opts.grace_period_seconds);
            let finalizing = strategy.prepare_for_delete(&mut next);
            let mark = !finalizers.is_empty() || grace > 0 || finalizing;
            if !mark {
                if opts.dry_run {
                    return Ok(Deleted::Now(current));
                }
                match self.remove(info, strategy, &key, &stored, &current).await? {
                    Some(_) => return Ok(Deleted::Now(current)),
                    None => {
                        fresh = self.refresh().await?;
                        continue;
                    }
                }
            }
            // Graceful: record when the delete happens, never later than asked before.
            let already = meta::deletion_timestamp(&current).is_some();
            let deadline = chrono::Utc::now() + chrono::Duration::seconds(grace);
            let stamp = deadline.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
            let previous_grace = current["metadata"]["deletionGracePeriodSeconds"].as_i64();
            if !already || previous_grace.is_some_and(|p| grace < p) {
                meta::set_str(&mut next, "deletionTimestamp", &stamp);
                if grace > 0 || previous_grace.is_some() {
                    next["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
                }
                if strategy.tracks_generation() && !already {
                    next["metadata"]["generation"] = json!(meta::generation(&current) + 1);
                }
            }
            if next == current {
                if !fresh {
                    fresh = self.refresh().await?;
                    continue;
                }
                return Ok(Deleted::Marked(current));
            }
            if grace == 0 && finalizers.is_empty() && !finalizing {
                match self.remove(info, strategy, &key, &stored, &current).await? {
                    Some(_) => return Ok(Deleted::Now(current)),
                    None => {
                        fresh = self.refresh().await?;
                        continue;
                    }
                }
            }
            if opts.dry_run {
                return Ok(Deleted::Marked(next));
            }
            let txn = Txn {
                compare: vec![unchanged_since(&key, stored.mod_revision)],
                success: vec![storage::put(&key, storage::encode(&next))],
                failure: vec![],
            };
            let (ok, _, revision) = self.objects.txn(txn).await?;
            if ok {
                meta::set_resource_version(&mut next, revision);
                return Ok(Deleted::Marked(next));
            }
            fresh = self.refresh().await?;
        }
        Err(ApiError::conflict(info, name, "too many concurrent writers; try again"))
    }

    /// Starts a watch of `info` in `namespace` ("" = all), of the object
    /// `name` only if given, filtered by the selectors.
    #[allow(clippy::too_many_arguments)]
    pub async fn watch(
        &self,
        ctx: &Context,
        info: &'static ResourceInfo,
        namespace: &str,
        name: &str,
        label_selector: &str,
        field_selector: &str,
        opts: WatchOptions,
    ) -> Result<tokio::sync::mpsc::Receiver<WatchEvent>, ApiError> {
        self.authorize(ctx, "watch", info, "", namespace, name)?;
        let mut field_selector = field_selector.to_string();
        if !name.is_empty() {
            if !field_selector.is_empty() {
                field_selector.push(',');
            }
            field_selector.push_str(&format!("metadata.name={name}"));
        }
        let (labels, fields) = selectors(info, label_selector, &field_selector)?;
        let filter = Filter {
            kind: info.kind_id,
            namespace: (info.namespaced && !namespace.is_empty()).then(|| namespace.to_string()),
            labels,
            fields,
        };
        self.fanout.watch(info, filter, opts).await
    }

    // ---------------------------------------------------------- subresources

    /// `pods/binding`: assigns an unscheduled pod to a node.
    pub async fn bind(&self, ctx: &Context, namespace: &str, name: &str, binding: &Value) -> Result<Value, ApiError> {
        let info = resources::of(Kind::Pod);
        let ns = self.scope(info, namespace)?;
        self.authorize(ctx, "create", info, "binding", ns.unwrap_or(""), name)?;
        let node = binding["target"]["name"]
            .as_str()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| ApiError::invalid(info, name, &[FieldError::required("target.name", "")]))?;
        let node = node.to_string();
        self.read_modify_write(ctx, info, ns, name, None, false, "create", "binding", Record::Skip, move |current| {
            strategy::pod::bind(info, current, &node)
        })
        .await?;
        Ok(json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}))
    }

    /// A TokenRequest on service account `name`: a signed token for it,
    /// optionally bound to a pod or Secret (see [`crate::service_account`]).
    pub async fn request_token(
        &self,
        ctx: &Context,
        namespace: &str,
        name: &str,
        request: &Value,
    ) -> Result<Value, ApiError> {
        let info = resources::of(Kind::ServiceAccount);
        let ns = self.scope(info, namespace)?.unwrap_or("");
        self.authorize(ctx, "create", info, "token", ns, name)?;
        let Some(tokens) = self.security.tokens() else {
            return Err(ApiError::new(
                skiff_api::Reason::NotFound,
                "service account tokens are not issued here: the apiserver has no --service-account-signing-key-file",
            ));
        };
        self.objects.prepare_read(Consistency::Linearizable).await?;
        if let Some(node) = crate::node_restriction::node_name(&ctx.user) {
            let pod_name = crate::node_restriction::token_pod(node, request)?;
            let pod = self.current(resources::of(Kind::Pod), Some(ns), &pod_name).await?;
            let pod = pod.map(|p| p.decode()).transpose()?;
            crate::node_restriction::token_request(node, request, pod.as_ref())?;
        }
        let found = self.objects.get(&info.key(Some(ns), name), 0).await?.0;
        let sa = found.ok_or_else(|| not_found(info, name))?.decode()?;
        tokens.request(ns, &sa, request).await
    }

    /// The `autoscaling/v1` Scale of a deployment or replica set.
    pub async fn get_scale(
        &self,
        ctx: &Context,
        info: &'static ResourceInfo,
        namespace: &str,
        name: &str,
    ) -> Result<Value, ApiError> {
        if !info.has_subresource("scale") {
            return Err(ApiError::not_found(info, &format!("{name}/scale")));
        }
        let obj = self.get(ctx, info, namespace, name, "").await?;
        Ok(scale_of(info, &obj))
    }

    async fn update_scale(
        &self,
        ctx: &Context,
        info: &'static ResourceInfo,
        ns: Option<&str>,
        name: &str,
        scale: Value,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        let replicas = scale["spec"]["replicas"]
            .as_i64()
            .ok_or_else(|| ApiError::invalid(info, name, &[FieldError::required("spec.replicas", "")]))?;
        if replicas < 0 {
            return Err(ApiError::invalid(
                info,
                name,
                &[FieldError::invalid("spec.replicas", &json!(replicas), "must be greater than or equal to 0")],
            ));
        }
        let precondition = meta::resource_version(&scale).map(parse_resource_version).transpose()?;
        let updated = self
            .read_modify_write(
                ctx,
                info,
                ns,
                name,
                precondition,
                dry_run,
                "update",
                "scale",
                Record::Update,
                move |current| {
                    let mut next = current.clone();
                    match info.custom.and_then(|c| c.scale.as_ref()) {
                        Some(paths) => skiff_api::custom::set_path(&mut next, &paths.spec_replicas, json!(replicas)),
                        None => next["spec"]["replicas"] = json!(replicas),
                    }
                    Ok(next)
                },
            )
            .await?;
        Ok(scale_of(info, &updated))
    }

    // ---------------------------------------------------------------- history

    /// Every stored revision of one object, oldest first.
    pub async fn history(
        &self,
        ctx: &Context,
        info: &'static ResourceInfo,
        namespace: &str,
        name: &str,
    ) -> Result<(Vec<HistoryEntry>, i64), ApiError> {
        let ns = self.scope(info, namespace)?;
        self.authorize(ctx, "get", info, "history", ns.unwrap_or(""), name)?;
        self.objects.prepare_read(Consistency::Linearizable).await?;
        let key = info.key(ns, name);
        let history =
            self.objects.store.history(key.into_bytes()).await.map_err(|e| ApiError::internal(e.to_string()))?;
        let (raw, compacted) = (history.entries, history.compacted);
        let mut out = Vec::with_capacity(raw.len());
        let mut previous: Option<Value> = None;
        for entry in raw {
            let (event, object) = match entry.kind {
                skiff_raft_store::EventKind::Put => {
                    let obj = self.objects.stored(entry.kv)?.decode()?;
                    let event = if previous.is_some() { "MODIFIED" } else { "ADDED" };
                    (event, obj)
                }
                skiff_raft_store::EventKind::Delete => {
                    let Some(mut last) = previous.clone() else { continue };
                    meta::set_resource_version(&mut last, entry.revision);
                    ("DELETED", last)
                }
            };
            let summary = match event {
                "DELETED" => "deleted".to_string(),
                _ => skiff_api::history::summarize(previous.as_ref(), Some(&object)),
            };
            previous = if event == "DELETED" { None } else { Some(object.clone()) };
            out.push(HistoryEntry {
                revision: entry.revision,
                event,
                commit_time_ms: entry.timestamp_ms,
                object,
                summary,
            });
        }
        if out.is_empty() {
            return Err(not_found(info, name));
        }
        Ok((out, compacted))
    }

    /// The object as it was at `revision`.
    pub async fn get_at_revision(
        &self,
        ctx: &Context,
        info: &'static ResourceInfo,
        namespace: &str,
        name: &str,
        revision: i64,
    ) -> Result<Value, ApiError> {
        let ns = self.scope(info, namespace)?;
        self.authorize(ctx, "get", info, "history", ns.unwrap_or(""), name)?;
        if revision <= 0 {
            return Err(ApiError::bad_request(format!("revision must be positive, got {revision}")));
        }
        self.objects.prepare_read(Consistency::AtLeast(revision)).await?;
        let (found, _) = self.objects.get(&info.key(ns, name), revision).await?;
        match found {
            Some(s) => s.decode(),
            None => Err(ApiError::new(
                skiff_api::Reason::NotFound,
                format!("{} \"{name}\" did not exist at revision {revision}", info.qualified()),
            )),
        }
    }

    /// Creates the PriorityClasses every cluster has
    /// (`system-node-critical`, `system-cluster-critical`), if missing.
    /// Idempotent: every master runs it at start.
    pub async fn ensure_system_priority_classes(&self) -> Result<(), ApiError> {
        let info = resources::of(Kind::PriorityClass);
        for class in priority::system_priority_classes() {
            let name = meta::name(&class).unwrap_or_default().to_string();
            match self.create(&Context::internal(), info, "", class, false).await {
                Ok(_) => tracing::info!(priority_class = name, "created system priority class"),
                Err(e) if e.reason == skiff_api::Reason::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Creates the default ClusterRoles and ClusterRoleBindings that are
    /// missing ([`crate::rbac::bootstrap`]); ones that exist are left as
    /// they are, changed or not.
    pub async fn ensure_bootstrap_policy(&self) -> Result<(), ApiError> {
        let roles = crate::rbac::bootstrap::cluster_roles().into_iter().map(|r| (Kind::ClusterRole, r));
        let bindings =
            crate::rbac::bootstrap::cluster_role_bindings().into_iter().map(|b| (Kind::ClusterRoleBinding, b));
        for (kind, obj) in roles.chain(bindings) {
            let name = meta::name(&obj).unwrap_or_default().to_string();
            match self.create(&Context::internal(), resources::of(kind), "", obj, false).await {
                Ok(_) => tracing::debug!(kind = ?kind, name, "created default RBAC object"),
                Err(e) if e.reason == skiff_api::Reason::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Creates the namespaces every cluster has, if missing. Idempotent:
    /// every master runs it at start.
    pub async fn ensure_default_namespaces(&self) -> Result<(), ApiError> {
        let info = resources::of(Kind::Namespace);
        for ns in DEFAULT_NAMESPACES {
            let obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
            match self.create(&Context::internal(), info, "", obj, false).await {
                Ok(_) => tracing::info!(namespace = ns, "created default namespace"),
                Err(e) if e.reason == skiff_api::Reason::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// A request's label and field selectors, parsed, with fields `info`'s kind
/// cannot be selected by refused.
fn selectors(info: &ResourceInfo, labels: &str, fields: &str) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let labels =
        LabelSelector::parse(labels).map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))?;
    let fields =
        FieldSelector::parse(fields).map_err(|e| ApiError::bad_request(format!("invalid field selector: {e}")))?;
    fields.check_supported(info.kind_id).map_err(|e| ApiError::bad_request(e.to_string()))?;
    Ok((labels, fields))
}

/// Applies an update body to the stored object: the status subresource
/// changes only status; the main resource changes everything but what the
/// kind's strategy keeps (the status, for kinds that have a status
/// subresource) and server-owned metadata.
fn merge_update(info: &ResourceInfo, current: &Value, body: &Value, subresource: &str) -> Value {
    if subresource == "status" {
        let mut next = current.clone();
        next["status"] = body.get("status").cloned().unwrap_or(json!({}));
        return next;
    }
    if subresource == "ephemeralcontainers" {
        // `pods/ephemeralcontainers` changes spec.ephemeralContainers and
        // nothing else (the strategy judges how).
        let mut next = current.clone();
        next["spec"]["ephemeralContainers"] = body["spec"].get("ephemeralContainers").cloned().unwrap_or(json!([]));
        return next;
    }
    if subresource == "finalize" {
        // A namespace's `finalize` changes its spec.finalizers and nothing else.
        let mut next = current.clone();
        next["spec"]["finalizers"] = body["spec"].get("finalizers").cloned().unwrap_or(json!([]));
        return next;
    }
    let mut next = body.clone();
    strategy::of(info.kind_id).prepare_for_update(info, &mut next, current);
    let keep = [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "namespace",
        "name",
    ];
    let cm = current.get("metadata").and_then(Value::as_object).cloned().unwrap_or_default();
    let m = meta::meta_mut(&mut next);
    for k in keep {
        match cm.get(k) {
            Some(v) => {
                m.insert(k.to_string(), v.clone());
            }
            None => {
                m.remove(k);
            }
        }
    }
    // managedFields stay as the body has them: the write's bookkeeping
    // starts from them if the client set them (see `managers_before`).
    m.remove("resourceVersion");
    if let Some(rv) = cm.get("resourceVersion") {
        m.insert("resourceVersion".into(), rv.clone());
    }
    next
}

/// The `autoscaling/v1` Scale of an object: of a custom resource from the
/// paths its definition names, else from `spec.replicas`,
/// `status.replicas` and the label selector.
fn scale_of(info: &ResourceInfo, obj: &Value) -> Value {
    if let Some(paths) = info.custom.and_then(|c| c.scale.as_ref()) {
        use skiff_api::custom::get_path;
        let replicas = |path: &str| get_path(obj, path).and_then(Value::as_i64).unwrap_or(0);
        let selector =
            paths.label_selector.as_deref().and_then(|p| get_path(obj, p)).and_then(Value::as_str).unwrap_or_default();
        return scale_document(obj, replicas(&paths.spec_replicas), replicas(&paths.status_replicas), selector);
    }
    // A ReplicationController's selector is the label map itself.
    let selector_map = match obj["spec"]["selector"].get("matchLabels") {
        Some(labels) => labels,
        None => &obj["spec"]["selector"],
    };
    let selector = selector_map
        .as_object()
        .map(|m| m.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default())).collect::<Vec<_>>().join(","))
        .unwrap_or_default();
    let (spec, status) =
        (obj["spec"]["replicas"].as_i64().unwrap_or(0), obj["status"]["replicas"].as_i64().unwrap_or(0));
    scale_document(obj, spec, status, &selector)
}

fn scale_document(obj: &Value, spec_replicas: i64, status_replicas: i64, selector: &str) -> Value {
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": meta::name(obj),
            "namespace": meta::namespace(obj),
            "uid": meta::uid(obj),
            "resourceVersion": meta::resource_version(obj),
            "creationTimestamp": obj["metadata"]["creationTimestamp"],
        },
        "spec": {"replicas": spec_replicas},
        "status": {"replicas": status_replicas, "selector": selector},
    })
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use skiff_api::Reason;

    use super::*;

    /// A pod as the store holds it: decoded, defaulted, with its metadata.
    fn stored_pod() -> Value {
        let pod = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web", "namespace": "default", "uid": "u-1", "resourceVersion": "7"},
            "spec": {"containers": [{"name": "c", "image": "nginx", "resources": {"requests": {"cpu": "100m"}}}]},
            "status": {"phase": "Pending"},
        });
        validation::normalize(resources::of(Kind::Pod), &pod).unwrap()
    }

    fn merged(current: &Value, patch: Value) -> Value {
        let mut doc = current.clone();
        json_patch::merge(&mut doc, &patch);
        doc
    }

    /// `finish_patch` for a status write, once as it runs for most writes
    /// (the stored spec left out of the round trip when unchanged) and once
    /// with the dropped fields reported, which always decodes the whole
    /// document.
    fn both_ways(current: &Value, patch: Value) -> (Result<Value, ApiError>, Result<Value, ApiError>) {
        let info = resources::of(Kind::Pod);
        let doc = merged(current, patch);
        let quick = finish_patch(info, current, doc.clone(), &PatchOptions::default(), "status");
        let whole = PatchOptions { warnings: Some(Arc::new(Mutex::new(Vec::new()))), ..PatchOptions::default() };
        (quick, finish_patch(info, current, doc, &whole, "status"))
    }

    #[test]
    fn a_status_patch_gives_what_decoding_the_whole_pod_gives() {
        let current = stored_pod();
        let (quick, whole) = both_ways(
            &current,
            json!({"status": {
                "phase": "Running",
                "podIP": "10.244.1.5",
                "conditions": [{"type": "Ready", "status": "True"}],
            }}),
        );
        let (quick, whole) = (quick.unwrap(), whole.unwrap());
        assert_eq!(quick, whole);
        assert_eq!(quick["spec"], current["spec"]);
        assert_eq!(quick["metadata"], current["metadata"]);
        assert_eq!(quick["status"]["phase"], "Running");
        assert_eq!(quick["status"]["podIP"], "10.244.1.5");
    }

    #[test]
    fn a_status_patch_that_changes_the_spec_still_has_the_spec_decoded() {
        let current = stored_pod();
        // A malformed spec is refused, as it is without the shortcut.
        for (quick, whole) in [
            both_ways(&current, json!({"spec": {"containers": "nginx"}, "status": {"phase": "Running"}})),
            both_ways(&current, json!({"spec": {"priority": "high"}})),
        ] {
            for err in [quick.unwrap_err(), whole.unwrap_err()] {
                assert_eq!(err.reason, Reason::BadRequest);
                assert!(err.message.starts_with("invalid Pod after patching"), "{}", err.message);
            }
        }
        // A well-formed one is decoded, and then kept as stored: a status
        // write changes the status alone.
        let (quick, whole) = both_ways(&current, json!({"spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}));
        let (quick, whole) = (quick.unwrap(), whole.unwrap());
        assert_eq!(quick, whole);
        assert_eq!(quick["spec"], current["spec"]);
        assert_eq!(quick["status"]["phase"], "Running");
    }

    #[test]
    fn a_malformed_status_is_refused_either_way() {
        let current = stored_pod();
        let (quick, whole) = both_ways(&current, json!({"status": {"phase": 3}}));
        for err in [quick.unwrap_err(), whole.unwrap_err()] {
            assert_eq!(err.reason, Reason::BadRequest);
        }
    }
}
