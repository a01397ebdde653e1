//! The OpenAPI documents: `/openapi/v3` (the index), `/openapi/v3/<gv>` (one
//! document per group-version Skiff serves) and `/openapi/v2` (swagger 2.0,
//! every group-version in one document), for `kubectl explain`, kubectl's
//! field validation and strategic-merge patches, server-side apply and the
//! client libraries. What kubectl reads from them is in KUBECTL.md §3 and
//! part 2 §8.
//!
//! # Layout
//! - The schemas are [`skiff_api::schemas::builtin`]: the k8s-openapi types'
//!   `schemars` schemas (their descriptions are the Kubernetes Go doc
//!   comments) with the list and map markers (`x-kubernetes-list-type`,
//!   `x-kubernetes-patch-strategy`, ...) Kubernetes puts on its fields, the
//!   same ones strategic merge and server-side apply read. [`generate`]
//!   adds what a document needs besides: the group-version-kind of every
//!   top-level kind and the `<Kind>List` schemas.
//! - The operations of every resource are built once per resource by
//!   [`operations`] and rendered twice: OpenAPI 3 (`requestBody`, `content`)
//!   and swagger 2.0 (`in: body` parameters, `consumes`).
//! - Each document keeps only the schemas its roots reach ([`reachable`]),
//!   so every `$ref` resolves inside the document that carries it.
//! - Everything is built once, on first use, serialized, hashed and cached
//!   in [`documents`]: the hash goes into the index's `serverRelativeURL`s
//!   and into the `ETag`s.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::LazyLock;

use k8s_openapi::api::{authentication, authorization, autoscaling, core, policy};
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_openapi::Resource;
use serde_json::{json, Map, Value};
use skiff_api::resources::{catalog, ResourceInfo};
use skiff_api::schemas;

use super::discovery::{groups, review_resources, subresource_kind};

/// Where schemas live in an OpenAPI 3 document, and in a swagger 2.0 one.
const V3_REFS: &str = schemas::REFS;
const V2_REFS: &str = "#/definitions/";

const STATUS: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Status";
const DELETE_OPTIONS: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions";
const PATCH: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Patch";

/// One document, serialized once.
pub struct Served {
    pub body: Vec<u8>,
    /// Of the body: the `?hash=` of the index's URLs and the `ETag`.
    pub hash: String,
}

impl Served {
    pub fn new(doc: &Value) -> Served {
        let body = serde_json::to_vec(doc).expect("JSON values serialize");
        Served { hash: hash(&body), body }
    }

    /// The quoted `ETag` header value.
    pub fn etag(&self) -> String {
        format!("\"{}\"", self.hash)
    }
}

/// Every OpenAPI document Skiff serves.
pub struct Documents {
    /// `/openapi/v3`.
    pub index: Served,
    /// `/openapi/v3/<gv>` by `<gv>` (`api/v1`, `apis/apps/v1`).
    pub v3: BTreeMap<String, Served>,
    /// `/openapi/v2`.
    pub v2: Served,
    /// Every built-in schema by name (custom documents reuse them).
    schemas: Map<String, Value>,
}

static DOCUMENTS: LazyLock<Documents> = LazyLock::new(build);

/// The documents, built on first use.
pub fn documents() -> &'static Documents {
    &DOCUMENTS
}

/// A stable content hash (the same build gives the same hash on every
/// master, so kubectl's cache stays valid across them).
fn hash(body: &[u8]) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    body.hash(&mut h);
    format!("{:016X}", h.finish())
}

fn build() -> Documents {
    let schemas = generate();
    let mut v3 = BTreeMap::new();
    let mut index = Map::new();
    let mut v2_paths = Map::new();
    for group in groups() {
        let gv = gv_path(group);
        let ops: Vec<Operation> = operations(group);
        let doc = v3_document(&ops, &[&schemas]);
        let served = Served::new(&doc);
        let url = format!("/openapi/v3/{gv}?hash={}", served.hash);
        index.insert(gv.clone(), json!({"serverRelativeURL": url}));
        v3.insert(gv, served);
        for (path, item) in v2_path_items(&ops) {
            v2_paths.insert(path, item);
        }
    }
    let v2 = v2_document(v2_paths, &schemas);
    Documents { index: Served::new(&json!({"paths": index})), v3, v2: Served::new(&v2), schemas }
}

/// The patch content types custom resources accept: no strategic merge.
const CUSTOM_PATCH_TYPES: [&str; 3] =
    ["application/json-patch+json", "application/merge-patch+json", "application/apply-patch+yaml"];

/// `com.example.v1.Widget`: how Kubernetes names a custom resource's
/// schema (the group reversed).
fn custom_schema_name(info: &ResourceInfo) -> String {
    let group: Vec<&str> = info.group.split('.').rev().collect();
    format!("{}.{}.{}", group.join("."), info.version, info.kind)
}

/// A custom resource's schema as Kubernetes publishes it: the version's
/// `openAPIV3Schema` with the standard `apiVersion`, `kind` and `metadata`.
fn custom_schema(info: &ResourceInfo, named: &Named) -> Value {
    let mut schema = info.custom.map(|c| c.schema.clone()).unwrap_or_else(|| json!({"type": "object"}));
    if !schema.is_object() {
        schema = json!({"type": "object"});
    }
    if !schema["properties"].is_object() {
        schema["properties"] = json!({});
    }
    let list = list_schema(named);
    for field in ["apiVersion", "kind"] {
        schema["properties"][field] = list["properties"][field].clone();
    }
    schema["properties"]["metadata"] = json!({
        "$ref": format!("{V3_REFS}io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"),
        "description": "Standard object's metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata",
    });
    schema["x-kubernetes-group-version-kind"] = json!([named.gvk()]);
    schema
}

/// The custom group-versions (`apis/<group>/<version>`) with their resources.
pub fn custom_group_versions(custom: &[&'static ResourceInfo]) -> BTreeMap<String, Vec<&'static ResourceInfo>> {
    let mut out: BTreeMap<String, Vec<&'static ResourceInfo>> = BTreeMap::new();
    for info in custom {
        out.entry(format!("apis/{}/{}", info.group, info.version)).or_default().push(info);
    }
    out
}

/// The OpenAPI 3 document of one custom group-version, built on request:
/// definitions change at run time. Its patch operations take JSON, merge
/// and apply patches, so kubectl computes no strategic merge for them.
pub fn custom_document(infos: &[&'static ResourceInfo]) -> Served {
    let mut ops = Vec::new();
    let mut own = Map::new();
    for info in infos {
        let named =
            Named { schema: custom_schema_name(info), group: info.group, version: info.version, kind: info.kind };
        own.insert(named.schema.clone(), custom_schema(info, &named));
        own.insert(named.list_schema(), list_schema(&named));
        let prefix = format!("/apis/{}/{}", info.group, info.version);
        resource_operations(&prefix, info, &named, &mut ops);
    }
    let mut doc = v3_document(&ops, &[&own, &documents().schemas]);
    let content: Map<String, Value> = CUSTOM_PATCH_TYPES
        .iter()
        .map(|t| (t.to_string(), json!({"schema": {"$ref": format!("{V3_REFS}{PATCH}")}})))
        .collect();
    for item in doc["paths"].as_object_mut().into_iter().flat_map(|p| p.values_mut()) {
        if let Some(patch) = item.get_mut("patch") {
            patch["requestBody"]["content"] = Value::Object(content.clone());
        }
    }
    Served::new(&doc)
}

/// `api/v1` for the core group, `apis/<group>/v1` otherwise.
fn gv_path(group: &str) -> String {
    if group.is_empty() {
        "api/v1".into()
    } else {
        format!("apis/{group}/v1")
    }
}

/// A top-level kind: its schema's name and its group-version-kind.
#[derive(Clone, Debug)]
struct Named {
    schema: String,
    group: &'static str,
    version: &'static str,
    kind: &'static str,
}

impl Named {
    fn gvk(&self) -> Value {
        json!({"group": self.group, "version": self.version, "kind": self.kind})
    }

    /// `io.k8s.api.core.v1.PodList`.
    fn list_schema(&self) -> String {
        format!("{}List", self.schema)
    }
}

/// A kind's schema name and group-version-kind.
fn named<T: Resource>() -> Named {
    let Some(schema) = schemas::name_of(T::GROUP, T::VERSION, T::KIND) else {
        panic!("skiff-api's build.rs generated no schema for {}: add the type to its roots", T::KIND);
    };
    Named { schema: schema.to_string(), group: T::GROUP, version: T::VERSION, kind: T::KIND }
}

/// A catalog kind's schema name and group-version-kind.
fn served_kind(info: &ResourceInfo) -> Named {
    let Some(schema) = schemas::name_of(info.group, info.version, info.kind) else {
        panic!("skiff-api's build.rs generated no schema for {}: add the type to its roots", info.kind);
    };
    Named { schema: schema.to_string(), group: info.group, version: info.version, kind: info.kind }
}

/// The kinds served besides the catalog's: subresources' and reviews'.
fn other_kinds() -> Vec<Named> {
    vec![
        named::<autoscaling::v1::Scale>(),
        named::<core::v1::Binding>(),
        named::<policy::v1::Eviction>(),
        named::<authentication::v1::TokenRequest>(),
        named::<authorization::v1::SelfSubjectAccessReview>(),
        named::<authorization::v1::SelfSubjectRulesReview>(),
        named::<authorization::v1::SubjectAccessReview>(),
        named::<authentication::v1::SelfSubjectReview>(),
        named::<meta::Status>(),
    ]
}

/// Every schema any document uses, by name, with `$ref`s in the OpenAPI 3
/// form (`#/components/schemas/...`) and the `$ref`-with-siblings form
/// schemars writes (`{"$ref": X, "description": D}`).
fn generate() -> Map<String, Value> {
    let kinds: Vec<Named> = catalog().iter().map(served_kind).collect();
    let others = other_kinds();
    let mut schemas = schemas::builtin().clone();
    for named in kinds.iter().chain(&others) {
        let Some(schema) = schemas.get_mut(&named.schema) else { continue };
        schema["x-kubernetes-group-version-kind"] = json!([named.gvk()]);
        // k8s-openapi requires `metadata` because its Rust field is not an
        // `Option`; Kubernetes does not (and `generateName` objects have none
        // to begin with).
        if let Some(required) = schema.get_mut("required").and_then(Value::as_array_mut) {
            required.retain(|r| r != "metadata");
            if required.is_empty() {
                schema.as_object_mut().expect("a kind's schema is an object").remove("required");
            }
        }
    }
    for named in &kinds {
        schemas.insert(named.list_schema(), list_schema(named));
    }
    // DeleteOptions is sent to every group.
    let versions: Vec<Value> =
        groups().into_iter().map(|g| json!({"group": g, "version": "v1", "kind": "DeleteOptions"})).collect();
    if let Some(schema) = schemas.get_mut(DELETE_OPTIONS) {
        schema["x-kubernetes-group-version-kind"] = json!(versions);
    }
    schemas
}

fn list_schema(named: &Named) -> Value {
    json!({
        "description": format!("{}List is a list of {}.", named.kind, named.kind),
        "type": "object",
        "required": ["items"],
        "properties": {
            "apiVersion": {"description": "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources", "type": "string"},
            "items": {"description": format!("List of {}.", named.kind), "type": "array",
                "items": {"$ref": format!("{V3_REFS}{}", named.schema)}},
            "kind": {"description": "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds", "type": "string"},
            "metadata": {"$ref": format!("{V3_REFS}io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta"),
                "description": "Standard list metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds"},
        },
        "x-kubernetes-group-version-kind": [{"group": named.group, "version": named.version, "kind": format!("{}List", named.kind)}],
    })
}

/// Every `$ref` target under `value`, by schema name.
fn refs(value: &Value, prefix: &str, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("$ref", Value::String(r)) => out.extend(r.strip_prefix(prefix).map(str::to_string)),
                    _ => refs(v, prefix, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| refs(v, prefix, out)),
        _ => {}
    }
}

/// A schema by name from the first of `layers` that has it.
fn lookup<'a>(layers: &[&'a Map<String, Value>], name: &str) -> Option<&'a Value> {
    layers.iter().find_map(|l| l.get(name))
}

/// The schemas reachable from `roots` (the roots included).
fn reachable(roots: impl IntoIterator<Item = String>, layers: &[&Map<String, Value>]) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo: Vec<String> = roots.into_iter().collect();
    while let Some(name) = todo.pop() {
        if let Some(schema) = lookup(layers, &name) {
            if seen.insert(name) {
                refs(schema, V3_REFS, &mut todo);
            }
        }
    }
    seen
}

/// OpenAPI 3 form: a `$ref` with siblings (a description) becomes
/// `allOf: [{$ref}]` beside them, as Kubernetes writes it (siblings of a
/// `$ref` are ignored in OpenAPI 3.0). Only a string `$ref` is a
/// reference: JSONSchemaProps has a property named `$ref` (a schema).
fn wrap_refs(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if map.len() > 1 && map.get("$ref").is_some_and(Value::is_string) {
                if let Some(r) = map.remove("$ref") {
                    map.insert("allOf".into(), json!([{"$ref": r}]));
                }
            }
            map.values_mut().for_each(wrap_refs);
        }
        Value::Array(items) => items.iter_mut().for_each(wrap_refs),
        _ => {}
    }
}

/// Swagger 2.0 form: `$ref`s into `#/definitions/`.
fn v2_refs(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if let Some(Value::String(r)) = map.get_mut("$ref") {
                if let Some(name) = r.strip_prefix(V3_REFS) {
                    *r = format!("{V2_REFS}{name}");
                }
            }
            map.values_mut().for_each(v2_refs);
        }
        Value::Array(items) => items.iter_mut().for_each(v2_refs),
        _ => {}
    }
}

/// What an operation does, in Kubernetes' `x-kubernetes-action` words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    List,
    Get,
    Post,
    Put,
    Patch,
    Delete,
    DeleteCollection,
}

impl Action {
    fn method(self) -> &'static str {
        match self {
            Action::List | Action::Get => "get",
            Action::Post => "post",
            Action::Put => "put",
            Action::Patch => "patch",
            Action::Delete | Action::DeleteCollection => "delete",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Action::List => "list",
            Action::Get => "get",
            Action::Post => "post",
            Action::Put => "put",
            Action::Patch => "patch",
            Action::Delete => "delete",
            Action::DeleteCollection => "deletecollection",
        }
    }

    /// The query parameters Skiff honours on it.
    fn parameters(self) -> &'static [&'static str] {
        match self {
            Action::List => &[
                "labelSelector",
                "fieldSelector",
                "limit",
                "continue",
                "resourceVersion",
                "watch",
                "allowWatchBookmarks",
                "timeoutSeconds",
            ],
            Action::Get => &[],
            Action::Post | Action::Put => &["dryRun", "fieldManager", "fieldValidation"],
            Action::Patch => &["dryRun", "fieldManager", "fieldValidation"],
            Action::Delete => &["dryRun", "gracePeriodSeconds", "propagationPolicy"],
            Action::DeleteCollection => &["labelSelector", "fieldSelector", "dryRun"],
        }
    }
}

/// The type and description of each query parameter.
fn parameter(name: &str) -> (&'static str, &'static str) {
    match name {
        "labelSelector" => ("string", "A selector to restrict the list of returned objects by their labels. Defaults to everything."),
        "fieldSelector" => ("string", "A selector to restrict the list of returned objects by their fields. Defaults to everything."),
        "limit" => ("integer", "The largest number of objects a list may return; the server may return fewer, with a continue token for the rest."),
        "continue" => ("string", "The continue token of a previous list with the same query, to read the next chunk."),
        "resourceVersion" => ("string", "Which version of the resource a list or watch starts from: unset is the most recent, \"0\" any, and a watch streams the changes after it."),
        "watch" => ("boolean", "Watch for changes to the described resources and return them as a stream of add, update, and remove notifications."),
        "allowWatchBookmarks" => ("boolean", "Whether the watch may send BOOKMARK events, which carry only a resourceVersion."),
        "timeoutSeconds" => ("integer", "How long a list or watch call may last, regardless of activity."),
        "dryRun" => ("string", "When present (All), the request is processed fully but nothing is stored."),
        "fieldManager" => ("string", "A name for the actor or entity that is making these changes."),
        "fieldValidation" => ("string", "What the server does with an object's unknown or duplicate fields: Ignore (drop them), Warn (drop them and say so in a Warning header) or Strict (refuse the request)."),
        "gracePeriodSeconds" => ("integer", "The seconds before the object should be deleted; zero means delete immediately."),
        "propagationPolicy" => ("string", "Whether and how garbage collection is performed: Orphan, Background or Foreground."),
        _ => ("string", ""),
    }
}

/// One operation on one path.
#[derive(Clone, Debug)]
struct Operation {
    path: String,
    action: Action,
    /// The kind the operation reads or writes.
    kind: Named,
    /// `readNamespacedPod`, `patchAppsV1NamespacedDeploymentScale`.
    id: String,
    /// The schema of the request body, if it has one.
    request: Option<String>,
    /// The schema of the answer.
    response: String,
    path_parameters: Vec<&'static str>,
}

/// `Core`, `Apps`, `DiscoveryK8sIo`: how Kubernetes names a group in its
/// operation ids.
fn group_word(group: &str) -> String {
    if group.is_empty() {
        return "CoreV1".into();
    }
    let mut word = String::new();
    for part in group.split('.') {
        let mut chars = part.chars();
        if let Some(first) = chars.next() {
            word.extend(first.to_uppercase());
            word.push_str(chars.as_str());
        }
    }
    format!("{word}V1")
}

/// Every operation Skiff serves in `group`.
fn operations(group: &str) -> Vec<Operation> {
    let mut ops = Vec::new();
    let prefix = format!("/{}", gv_path(group));
    for info in catalog().iter().filter(|r| r.group == group) {
        let kind = served_kind(info);
        resource_operations(&prefix, info, &kind, &mut ops);
    }
    for (_, plural, _, _) in review_resources(group) {
        let kind = match *plural {
            "selfsubjectaccessreviews" => named::<authorization::v1::SelfSubjectAccessReview>(),
            "selfsubjectrulesreviews" => named::<authorization::v1::SelfSubjectRulesReview>(),
            "subjectaccessreviews" => named::<authorization::v1::SubjectAccessReview>(),
            _ => named::<authentication::v1::SelfSubjectReview>(),
        };
        ops.push(Operation {
            path: format!("{prefix}/{plural}"),
            action: Action::Post,
            id: format!("create{}{}", group_word(group), kind.kind),
            request: Some(kind.schema.clone()),
            response: kind.schema.clone(),
            kind,
            path_parameters: vec![],
        });
    }
    ops
}

fn resource_operations(prefix: &str, info: &ResourceInfo, kind: &Named, ops: &mut Vec<Operation>) {
    let word = group_word(info.group);
    let (scope, scoped, mut params) = if info.namespaced {
        (format!("{prefix}/namespaces/{{namespace}}/{}", info.plural), "Namespaced", vec!["namespace"])
    } else {
        (format!("{prefix}/{}", info.plural), "", vec![])
    };
    let one = format!("{scope}/{{name}}");
    let list = kind.list_schema();
    let make = |path: &str,
                action: Action,
                verb: &str,
                suffix: &str,
                kind: &Named,
                request: bool,
                response: &str,
                params: &[&'static str]| Operation {
        path: path.to_string(),
        action,
        kind: kind.clone(),
        id: format!("{verb}{word}{scoped}{}{suffix}", info.kind),
        request: request.then(|| kind.schema.clone()),
        response: response.to_string(),
        path_parameters: params.to_vec(),
    };
    ops.push(make(&scope, Action::List, "list", "", kind, false, &list, &params));
    ops.push(make(&scope, Action::Post, "create", "", kind, true, &kind.schema, &params));
    ops.push(make(&scope, Action::DeleteCollection, "deleteCollection", "", kind, false, STATUS, &params));
    if info.namespaced {
        ops.push(Operation {
            path: format!("{prefix}/{}", info.plural),
            action: Action::List,
            kind: kind.clone(),
            id: format!("list{word}{}ForAllNamespaces", info.kind),
            request: None,
            response: list.clone(),
            path_parameters: vec![],
        });
    }
    params.push("name");
    ops.push(make(&one, Action::Get, "read", "", kind, false, &kind.schema, &params));
    ops.push(make(&one, Action::Put, "replace", "", kind, true, &kind.schema, &params));
    ops.push(make(&one, Action::Patch, "patch", "", kind, false, &kind.schema, &params));
    ops.push(make(&one, Action::Delete, "delete", "", kind, false, STATUS, &params));
    for sub in info.subresources {
        let path = format!("{one}/{sub}");
        let (g, _, k) = subresource_kind(info, sub);
        let sub_kind = match k.as_str() {
            "Scale" => named::<autoscaling::v1::Scale>(),
            "Binding" => named::<core::v1::Binding>(),
            "Eviction" => named::<policy::v1::Eviction>(),
            "TokenRequest" => named::<authentication::v1::TokenRequest>(),
            _ => kind.clone(),
        };
        debug_assert!(g == sub_kind.group, "{sub} of {} answers with its own group", info.kind);
        let suffix = match *sub {
            "status" => "Status",
            "scale" => "Scale",
            "binding" => "Binding",
            "eviction" => "Eviction",
            "token" => "Token",
            "log" => "Log",
            "ephemeralcontainers" => "EphemeralContainers",
            _ => "Finalize",
        };
        let schema = sub_kind.schema.as_str();
        match *sub {
            "binding" | "token" | "eviction" => {
                ops.push(make(&path, Action::Post, "create", suffix, &sub_kind, true, schema, &params))
            }
            "finalize" => ops.push(make(&path, Action::Put, "replace", suffix, &sub_kind, true, schema, &params)),
            // The log is text and exec, attach and port-forward are streams
            // (proxied to the node): no schema of their own.
            "log" | "exec" | "attach" | "portforward" => {}
            _ => {
                ops.push(make(&path, Action::Get, "read", suffix, &sub_kind, false, schema, &params));
                ops.push(make(&path, Action::Put, "replace", suffix, &sub_kind, true, schema, &params));
                ops.push(make(&path, Action::Patch, "patch", suffix, &sub_kind, false, schema, &params));
            }
        }
    }
}

fn path_parameter(name: &str) -> Value {
    let description = match name {
        "namespace" => "object name and auth scope, such as for teams and projects",
        _ => "name of the object",
    };
    json!({"name": name, "in": "path", "required": true, "description": description})
}

/// The patch content types Skiff accepts.
const PATCH_TYPES: [&str; 3] =
    ["application/json-patch+json", "application/merge-patch+json", "application/strategic-merge-patch+json"];

fn v3_operation(op: &Operation) -> Value {
    let mut parameters: Vec<Value> = op
        .path_parameters
        .iter()
        .map(|p| {
            let mut p = path_parameter(p);
            p["schema"] = json!({"type": "string", "uniqueItems": true});
            p
        })
        .collect();
    for name in op.action.parameters() {
        let (ty, description) = parameter(name);
        parameters.push(json!({"name": name, "in": "query", "description": description,
            "schema": {"type": ty, "uniqueItems": true}}));
    }
    let schema_ref = |name: &str| json!({"schema": {"$ref": format!("{V3_REFS}{name}")}});
    let mut o = json!({
        "operationId": op.id,
        "description": format!("{} {}", op.action.name(), op.kind.kind),
        "parameters": parameters,
        "responses": {"200": {"description": "OK", "content": {"application/json": schema_ref(&op.response)}}},
        "x-kubernetes-action": op.action.name(),
        "x-kubernetes-group-version-kind": op.kind.gvk(),
    });
    if let Some(request) = &op.request {
        o["requestBody"] = json!({"required": true, "content": {"*/*": schema_ref(request)}});
    }
    if op.action == Action::Patch {
        let content: Map<String, Value> = PATCH_TYPES.iter().map(|t| (t.to_string(), schema_ref(PATCH))).collect();
        o["requestBody"] = json!({"required": true, "content": content});
    }
    if matches!(op.action, Action::Delete | Action::DeleteCollection) {
        o["requestBody"] = json!({"content": {"*/*": schema_ref(DELETE_OPTIONS)}});
    }
    o
}

/// The OpenAPI 3 document of `ops`, with the schemas they reach from
/// `layers` (the first that has a name wins).
fn v3_document(ops: &[Operation], layers: &[&Map<String, Value>]) -> Value {
    let mut paths = Map::new();
    for op in ops {
        let item = paths.entry(op.path.clone()).or_insert_with(|| json!({}));
        item[op.action.method()] = v3_operation(op);
    }
    let roots = ops.iter().flat_map(|op| [Some(op.response.clone()), op.request.clone()]).flatten().chain([
        STATUS.to_string(),
        DELETE_OPTIONS.to_string(),
        PATCH.to_string(),
    ]);
    let mut components = Map::new();
    for name in reachable(roots, layers) {
        let Some(mut schema) = lookup(layers, &name).cloned() else { continue };
        wrap_refs(&mut schema);
        components.insert(name, schema);
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": paths,
        "components": {"schemas": components},
    })
}

fn v2_path_items(ops: &[Operation]) -> Vec<(String, Value)> {
    let mut items: BTreeMap<String, Value> = BTreeMap::new();
    for op in ops {
        let mut parameters: Vec<Value> = op
            .path_parameters
            .iter()
            .map(|p| {
                let mut p = path_parameter(p);
                p["type"] = json!("string");
                p["uniqueItems"] = json!(true);
                p
            })
            .collect();
        for name in op.action.parameters() {
            let (ty, description) = parameter(name);
            parameters.push(
                json!({"name": name, "in": "query", "type": ty, "uniqueItems": true, "description": description}),
            );
        }
        let body = match op.action {
            Action::Patch => Some(PATCH),
            Action::Delete | Action::DeleteCollection => Some(DELETE_OPTIONS),
            _ => op.request.as_deref(),
        };
        if let Some(body) = body {
            parameters.push(json!({"name": "body", "in": "body", "required": op.action != Action::Delete,
                "schema": {"$ref": format!("{V2_REFS}{body}")}}));
        }
        let mut o = json!({
            "operationId": op.id,
            "description": format!("{} {}", op.action.name(), op.kind.kind),
            "produces": ["application/json"],
            "schemes": ["https"],
            "parameters": parameters,
            "responses": {"200": {"description": "OK", "schema": {"$ref": format!("{V2_REFS}{}", op.response)}}},
            "x-kubernetes-action": op.action.name(),
            "x-kubernetes-group-version-kind": op.kind.gvk(),
        });
        if op.action == Action::Patch {
            o["consumes"] = json!(PATCH_TYPES);
        } else {
            o["consumes"] = json!(["*/*"]);
        }
        items.entry(op.path.clone()).or_insert_with(|| json!({}))[op.action.method()] = o;
    }
    items.into_iter().collect()
}

fn v2_document(paths: Map<String, Value>, schemas: &Map<String, Value>) -> Value {
    let mut definitions = Value::Object(schemas.clone());
    v2_refs(&mut definitions);
    json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": paths,
        "definitions": definitions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v3(gv: &str) -> Value {
        serde_json::from_slice(&documents().v3[gv].body).unwrap()
    }

    /// Follows `$ref` and `allOf: [{$ref}]` to the named schema.
    fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
        let r = schema["$ref"].as_str().or_else(|| schema["allOf"][0]["$ref"].as_str());
        match r {
            Some(r) => &doc["components"]["schemas"][r.strip_prefix(V3_REFS).unwrap()],
            None => schema,
        }
    }

    #[test]
    fn a_pods_containers_resolve_to_container_with_its_description_and_list_markers() {
        let doc = v3("api/v1");
        let pod = &doc["components"]["schemas"]["io.k8s.api.core.v1.Pod"];
        assert_eq!(pod["x-kubernetes-group-version-kind"], json!([{"group": "", "version": "v1", "kind": "Pod"}]));
        assert!(pod.get("required").is_none(), "metadata is not required: {pod}");
        let spec = resolve(&doc, &pod["properties"]["spec"]);
        assert!(pod["properties"]["spec"]["description"].as_str().unwrap().contains("Specification"));
        let containers = &spec["properties"]["containers"];
        assert_eq!(containers["type"], "array");
        assert_eq!(containers["x-kubernetes-list-type"], "map");
        assert_eq!(containers["x-kubernetes-list-map-keys"], json!(["name"]));
        assert_eq!(containers["x-kubernetes-patch-merge-key"], "name");
        assert_eq!(containers["x-kubernetes-patch-strategy"], "merge");
        let container = resolve(&doc, &containers["items"]);
        assert_eq!(container["description"], "A single application container that you want to run within a pod.");
        assert!(container["required"].as_array().unwrap().contains(&json!("name")));
        let ports = &container["properties"]["ports"];
        assert_eq!(ports["x-kubernetes-list-map-keys"], json!(["containerPort", "protocol"]));
        let port = resolve(&doc, &ports["items"]);
        assert_eq!(port["properties"]["containerPort"]["format"], "int32");
        let meta = resolve(&doc, &pod["properties"]["metadata"]);
        assert_eq!(meta["properties"]["finalizers"]["x-kubernetes-list-type"], "set");
        assert_eq!(
            meta["properties"]["creationTimestamp"]["allOf"][0]["$ref"],
            format!("{V3_REFS}io.k8s.apimachinery.pkg.apis.meta.v1.Time")
        );
    }

    fn every_ref_resolves(doc: &Value, prefix: &str, holder: &str) {
        let mut found = Vec::new();
        refs(doc, prefix, &mut found);
        assert!(!found.is_empty());
        let schemas = doc[holder].as_object().or_else(|| doc["components"][holder].as_object()).unwrap();
        for name in found {
            assert!(schemas.contains_key(&name), "{name} is referenced but not in the document");
        }
        let mut all = Vec::new();
        refs(doc, "", &mut all);
        assert!(all.iter().all(|r| r.starts_with(prefix)), "every $ref is local");
    }

    #[test]
    fn a_property_named_ref_is_a_schema_not_a_reference() {
        // JSONSchemaProps (CRDs) has properties `$ref` and `allOf`: only a
        // string `$ref` is wrapped, so Go's schema parser (kubectl) reads
        // the document.
        let mut schema = json!({"properties": {"$ref": {"type": "string"}, "allOf": {"type": "array"}},
            "items": {"$ref": "#/components/schemas/X", "description": "d"}});
        wrap_refs(&mut schema);
        assert_eq!(schema["properties"], json!({"$ref": {"type": "string"}, "allOf": {"type": "array"}}));
        assert_eq!(schema["items"], json!({"allOf": [{"$ref": "#/components/schemas/X"}], "description": "d"}));
    }

    #[test]
    fn every_ref_resolves_inside_its_document() {
        for (gv, served) in &documents().v3 {
            let doc: Value = serde_json::from_slice(&served.body).unwrap();
            every_ref_resolves(&doc, V3_REFS, "schemas");
            assert!(doc["components"]["schemas"].get("io.k8s.apimachinery.pkg.apis.meta.v1.Status").is_some(), "{gv}");
        }
        let v2: Value = serde_json::from_slice(&documents().v2.body).unwrap();
        assert_eq!(v2["swagger"], "2.0");
        every_ref_resolves(&v2, V2_REFS, "definitions");
    }

    #[test]
    fn every_served_kind_has_its_schema_and_paths_with_its_group_version_kind() {
        let index: Value = serde_json::from_slice(&documents().index.body).unwrap();
        for info in catalog() {
            let gv = gv_path(info.group);
            let url = index["paths"][&gv]["serverRelativeURL"].as_str().unwrap();
            assert_eq!(url, format!("/openapi/v3/{gv}?hash={}", documents().v3[&gv].hash));
            let doc = v3(&gv);
            let gvk = json!({"group": info.group, "version": "v1", "kind": info.kind});
            let schema = doc["components"]["schemas"]
                .as_object()
                .unwrap()
                .values()
                .find(|s| s["x-kubernetes-group-version-kind"].as_array().is_some_and(|l| l.contains(&gvk)));
            assert!(schema.is_some_and(|s| s["properties"]["metadata"].is_object()), "{}", info.kind);
            let scope = if info.namespaced { "namespaces/{namespace}/" } else { "" };
            let one = &doc["paths"][format!("/{gv}/{scope}{}/{{name}}", info.plural)];
            assert_eq!(one["patch"]["x-kubernetes-group-version-kind"], gvk);
            let params = one["patch"]["parameters"].as_array().unwrap();
            assert!(params.iter().any(|p| p["name"] == "fieldValidation"), "{}", info.kind);
            let list = &doc["paths"][format!("/{gv}/{scope}{}", info.plural)];
            let list_ref = list["get"]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].as_str();
            assert_eq!(list_ref.unwrap(), format!("{V3_REFS}{}List", schema_name_of(&doc, &gvk)));
        }
        assert!(!documents().v3.contains_key("apis/widgets/v1"));
    }

    fn schema_name_of(doc: &Value, gvk: &Value) -> String {
        doc["components"]["schemas"]
            .as_object()
            .unwrap()
            .iter()
            .find(|(_, s)| s["x-kubernetes-group-version-kind"].as_array().is_some_and(|l| l.contains(gvk)))
            .map(|(n, _)| n.clone())
            .unwrap()
    }

    #[test]
    fn a_deployments_strategy_retains_keys_and_scale_is_in_apps() {
        let doc = v3("apis/apps/v1");
        let spec = &doc["components"]["schemas"]["io.k8s.api.apps.v1.DeploymentSpec"];
        assert_eq!(spec["properties"]["strategy"]["x-kubernetes-patch-strategy"], "retainKeys");
        assert!(spec["properties"]["strategy"]["allOf"].is_array());
        let scale = &doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}/scale"]["patch"];
        assert_eq!(
            scale["x-kubernetes-group-version-kind"],
            json!({"group": "autoscaling", "version": "v1", "kind": "Scale"})
        );
        assert!(doc["components"]["schemas"]["io.k8s.api.autoscaling.v1.Scale"].is_object());
        assert!(doc["components"]["schemas"].get("io.k8s.api.core.v1.Pod").is_none(), "only what apps reaches");
    }

    #[test]
    fn the_documents_are_built_once_and_hash_their_content() {
        assert!(std::ptr::eq(documents(), documents()));
        let a = &documents().v3["api/v1"];
        assert_eq!(a.hash, hash(&a.body));
        assert_ne!(a.hash, documents().v3["apis/apps/v1"].hash);
        assert_eq!(a.etag(), format!("\"{}\"", a.hash));
    }
}
