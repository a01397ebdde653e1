//! Custom resources: the kinds a CustomResourceDefinition adds, served as
//! Kubernetes' apiextensions-apiserver serves them.
//!
//! A CRD (`apiextensions.k8s.io/v1`) names a group, a kind with its plural,
//! a scope and versions. Each served version becomes one [`ResourceInfo`]
//! of [`Kind::Custom`] ([`resources_of`]) whose [`CustomResource`] carries
//! what the generic code asks of a kind: the version's structural schema,
//! from which objects are pruned ([`normalize`]), defaulted ([`default`])
//! and validated ([`validate`]), and its printer columns ([`cells`]).
//! Versions convert as a CRD without a webhook converts (`None`): only
//! `apiVersion` changes.
//!
//! The definitions themselves are checked by [`validate_definition`], and
//! their status (accepted names, conditions, stored versions) is the
//! apiserver's to write ([`status_of`]).
//!
//! CEL rules (`x-kubernetes-validations`) are checked and run by the `rules` module.
//!
//! Not done: `oneOf`/`anyOf`/`allOf`/`not`, `format` checks, webhook
//! conversion and validation ratcheting.

use chrono::{DateTime, Utc};
use serde_json::{json, Map, Value};

use crate::field::{FieldError, Path};
use crate::resources::{Kind, ResourceInfo};
use crate::structure::Structure;
use crate::table::Column;
use crate::validation::{is_dns1035_label, is_dns1123_subdomain};

/// What one served version of a CRD adds to its [`ResourceInfo`].
#[derive(Debug, PartialEq, Eq)]
pub struct CustomResource {
    /// The version's `schema.openAPIV3Schema`.
    pub schema: Value,
    /// The same schema's list and map markers, for server-side apply.
    pub structure: Structure,
    /// The table columns: Name, then the version's printer columns (Age
    /// when it declares none).
    pub columns: Vec<Column>,
    /// The JSONPath of every column after Name.
    pub paths: Vec<String>,
    /// The version objects are stored at.
    pub storage_version: &'static str,
    /// Where the `scale` subresource reads and writes, if the version has one.
    pub scale: Option<ScalePaths>,
}

/// A version's `subresources.scale`: the fields an `autoscaling/v1` Scale
/// maps to, as field paths (`.spec.replicas`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScalePaths {
    /// Under `.spec`: the desired replicas, which a Scale update writes.
    pub spec_replicas: String,
    /// Under `.status`: the observed replicas.
    pub status_replicas: String,
    /// Under `.spec` or `.status`: the label selector, as a string.
    pub label_selector: Option<String>,
}

/// The segments of a simple field path (`.spec.replicas`), or `None` if it
/// is not one (array indices, brackets and empty segments are not).
fn field_path(path: &str) -> Option<Vec<&str>> {
    let rest = path.strip_prefix('.')?;
    let segments: Vec<&str> = rest.split('.').collect();
    let simple = |s: &&str| !s.is_empty() && !s.contains(['[', ']', '*', '@', '$']);
    segments.iter().all(simple).then_some(segments)
}

/// The value at a simple field path, if there is one.
pub fn get_path<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    field_path(path)?.into_iter().try_fold(obj, |v, segment| v.get(segment))
}

/// Sets the value at a simple field path, making the objects on the way.
pub fn set_path(obj: &mut Value, path: &str, value: Value) {
    let Some(segments) = field_path(path) else { return };
    let mut at = obj;
    for segment in segments {
        if !at.is_object() {
            *at = json!({});
        }
        at = at.as_object_mut().expect("made an object").entry(segment).or_insert(Value::Null);
    }
    *at = value;
}

fn scale_paths(version: &Value) -> Option<ScalePaths> {
    let scale = version.pointer("/subresources/scale").filter(|s| s.is_object())?;
    Some(ScalePaths {
        spec_replicas: text(scale, "/specReplicasPath").to_string(),
        status_replicas: text(scale, "/statusReplicasPath").to_string(),
        label_selector: scale["labelSelectorPath"].as_str().filter(|p| !p.is_empty()).map(str::to_string),
    })
}

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_string().into_boxed_str())
}

fn leak_all(v: &Value) -> &'static [&'static str] {
    let items: Vec<&'static str> = v.as_array().into_iter().flatten().filter_map(Value::as_str).map(leak).collect();
    Box::leak(items.into_boxed_slice())
}

fn text<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or_default()
}

/// The singular name, `kind` lowercased unless the CRD names one.
fn singular(spec: &Value) -> String {
    match text(spec, "/names/singular") {
        "" => text(spec, "/names/kind").to_ascii_lowercase(),
        s => s.to_string(),
    }
}

/// The resources a stored (valid) CRD serves, one per served version.
///
/// Their strings are leaked, since [`ResourceInfo`] holds `'static` ones:
/// callers build them once per change of the definition.
pub fn resources_of(crd: &Value) -> Vec<ResourceInfo> {
    let spec = &crd["spec"];
    let versions = spec["versions"].as_array().cloned().unwrap_or_default();
    let storage = versions.iter().find(|v| v["storage"] == json!(true)).map(|v| text(v, "/name")).unwrap_or_default();
    let storage_version = leak(storage);
    let (group, kind, plural) =
        (leak(text(spec, "/group")), leak(text(spec, "/names/kind")), leak(text(spec, "/names/plural")));
    let singular = leak(&singular(spec));
    let short_names = leak_all(&spec["names"]["shortNames"]);
    let categories = leak_all(&spec["names"]["categories"]);
    let namespaced = text(spec, "/scope") != "Cluster";
    versions
        .iter()
        .filter(|v| v["served"] == json!(true))
        .map(|v| {
            let scale = scale_paths(v);
            let status = v.pointer("/subresources/status").is_some_and(Value::is_object);
            let subresources: &'static [&'static str] = match (status, scale.is_some()) {
                (true, true) => &["status", "scale"],
                (true, false) => &["status"],
                (false, true) => &["scale"],
                (false, false) => &[],
            };
            let (columns, paths) = columns_of(v);
            let schema = v.pointer("/schema/openAPIV3Schema").cloned().unwrap_or_else(|| json!({"type": "object"}));
            let custom = CustomResource {
                structure: Structure::custom(&schema),
                schema,
                columns,
                paths,
                storage_version,
                scale,
            };
            ResourceInfo {
                kind_id: Kind::Custom,
                group,
                version: leak(text(v, "/name")),
                kind,
                plural,
                singular,
                short_names,
                namespaced,
                subresources,
                categories,
                custom: Some(Box::leak(Box::new(custom))),
            }
        })
        .collect()
}

fn columns_of(version: &Value) -> (Vec<Column>, Vec<String>) {
    let name = Column {
        name: "Name",
        type_: "string",
        format: "name",
        description: "Name must be unique within a namespace.",
        priority: 0,
    };
    let declared = version["additionalPrinterColumns"].as_array().cloned().unwrap_or_default();
    if declared.is_empty() {
        let age = Column {
            name: "Age",
            type_: "date",
            format: "",
            description: "CreationTimestamp is a timestamp representing the server time when this object was created.",
            priority: 0,
        };
        return (vec![name, age], vec![".metadata.creationTimestamp".into()]);
    }
    let mut columns = vec![name];
    let mut paths = Vec::new();
    for c in &declared {
        columns.push(Column {
            name: leak(text(c, "/name")),
            type_: leak(text(c, "/type")),
            format: leak(text(c, "/format")),
            description: leak(text(c, "/description")),
            priority: c["priority"].as_i64().unwrap_or(0) as i32,
        });
        paths.push(text(c, "/jsonPath").to_string());
    }
    (columns, paths)
}

// ---------------------------------------------------------------------------
// Objects: pruning, defaulting, validation

fn custom(info: &ResourceInfo) -> &CustomResource {
    info.custom.expect("custom resources carry their schema")
}

/// `obj` as stored: apiVersion and kind set, metadata as ObjectMeta has
/// it, and every field the schema does not know pruned (Kubernetes prunes
/// unknown fields of structural schemas), so strict field validation can
/// name them.
pub fn normalize(info: &ResourceInfo, obj: &Value) -> Result<Value, FieldError> {
    let Some(map) = obj.as_object() else {
        return Err(FieldError::type_invalid("", "the object must be a JSON object"));
    };
    let schema = &custom(info).schema;
    let mut out = Map::new();
    out.insert("apiVersion".into(), Value::String(info.api_version()));
    out.insert("kind".into(), Value::String(info.kind.to_string()));
    let metadata = map.get("metadata").cloned().unwrap_or_else(|| json!({}));
    let metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta =
        serde_json::from_value(metadata).map_err(|e| FieldError::type_invalid("metadata", e.to_string()))?;
    out.insert("metadata".into(), serde_json::to_value(metadata).unwrap_or_else(|_| json!({})));
    for (k, v) in map {
        if matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        if let Some(kept) = prune_field(schema, k, v) {
            out.insert(k.clone(), kept);
        }
    }
    Ok(Value::Object(out))
}

fn preserves_unknown(schema: &Value) -> bool {
    schema["x-kubernetes-preserve-unknown-fields"] == json!(true)
}

/// The schema of `key` in an object of `schema`: its property, else the
/// `additionalProperties` schema; `Err(keep)` when neither names it (keep:
/// whether unknown fields are kept as they are).
fn field_schema<'a>(schema: &'a Value, key: &str) -> Result<&'a Value, bool> {
    if let Some(p) = schema.get("properties").and_then(|p| p.get(key)) {
        return Ok(p);
    }
    match schema.get("additionalProperties") {
        Some(a) if a.is_object() => Ok(a),
        Some(Value::Bool(true)) => Err(true),
        _ => Err(preserves_unknown(schema)),
    }
}

/// The value of field `key` of an object of `schema`, pruned; `None` if
/// the field goes.
fn prune_field(schema: &Value, key: &str, value: &Value) -> Option<Value> {
    match field_schema(schema, key) {
        Ok(s) => {
            if value.is_null() && s["nullable"] != json!(true) && s.get("default").is_none_or(Value::is_null) {
                // Kubernetes drops nulls of non-nullable fields.
                return None;
            }
            Some(prune(s, value))
        }
        Err(true) => Some(value.clone()),
        Err(false) => None,
    }
}

/// `value` without the fields `schema` does not know.
fn prune(schema: &Value, value: &Value) -> Value {
    match value {
        Value::Object(m) if schema["x-kubernetes-embedded-resource"] == json!(true) || is_object_schema(schema) => {
            let embedded = schema["x-kubernetes-embedded-resource"] == json!(true);
            let mut out = Map::new();
            for (k, v) in m {
                if embedded && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                    out.insert(k.clone(), v.clone());
                } else if let Some(kept) = prune_field(schema, k, v) {
                    out.insert(k.clone(), kept);
                }
            }
            Value::Object(out)
        }
        Value::Array(items) => match schema.get("items") {
            Some(s) if s.is_object() => Value::Array(items.iter().map(|i| prune(s, i)).collect()),
            _ => value.clone(),
        },
        _ => value.clone(),
    }
}

fn is_object_schema(schema: &Value) -> bool {
    schema["type"] == "object" || schema.get("properties").is_some() || schema.get("additionalProperties").is_some()
}

/// Fills in the schema's `default`s for missing fields, as Kubernetes does
/// on every write (after pruning).
pub fn default(info: &ResourceInfo, obj: &mut Value) {
    let schema = &custom(info).schema;
    if let Some(m) = obj.as_object_mut() {
        for (k, v) in m.iter_mut() {
            if matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                continue;
            }
            if let Ok(s) = field_schema(schema, k) {
                default_value(s, v);
            }
        }
        default_missing(schema, m, true);
    }
}

fn default_missing(schema: &Value, m: &mut Map<String, Value>, root: bool) {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    for (k, s) in props {
        if root && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        if let Some(d) = s.get("default").filter(|d| !d.is_null()) {
            if m.get(k).is_none_or(Value::is_null) {
                let mut d = d.clone();
                default_value(s, &mut d);
                m.insert(k.clone(), d);
            }
        }
    }
}

fn default_value(schema: &Value, value: &mut Value) {
    match value {
        Value::Object(m) => {
            for (k, v) in m.iter_mut() {
                if let Ok(s) = field_schema(schema, k) {
                    default_value(s, v);
                }
            }
            default_missing(schema, m, false);
        }
        Value::Array(items) => {
            if let Some(s) = schema.get("items").filter(|s| s.is_object()) {
                for i in items {
                    default_value(s, i);
                }
            }
        }
        _ => {}
    }
}

/// Every way `obj` (normalized and defaulted) breaks its version's schema,
/// with Kubernetes' paths and messages (`spec.replicas in body must be of
/// type integer: "string"`); `old` is the stored object on update, which
/// transition rules compare with.
pub fn validate(info: &ResourceInfo, obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let schema = &custom(info).schema;
    let mut errs = Vec::new();
    let Some(m) = obj.as_object() else {
        return errs;
    };
    for (k, v) in m {
        if matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        if let Ok(s) = field_schema(schema, k) {
            check(s, v, old.and_then(|o| o.get(k)), &Path::new(k), &mut errs);
        }
    }
    check_required(schema, m, &Path::new(""), &mut errs);
    if schema.get("x-kubernetes-validations").is_some() {
        let old = old.map(rules::root_view);
        rules::evaluate(schema, &rules::root_view(obj), old.as_ref(), &Path::new(""), &mut errs);
    }
    errs
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn has_type(v: &Value, ty: &str) -> bool {
    match ty {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0),
        "number" => v.is_number(),
        _ => true,
    }
}

fn check_required(schema: &Value, m: &Map<String, Value>, path: &Path, errs: &mut Vec<FieldError>) {
    for r in schema["required"].as_array().into_iter().flatten().filter_map(Value::as_str) {
        if m.get(r).is_none_or(Value::is_null) {
            errs.push(FieldError::required(path.child(r).as_str(), ""));
        }
    }
}

/// Checks `v` against `schema`; `old` is the value at the same place in the
/// stored object, where an update has one.
fn check(schema: &Value, v: &Value, old: Option<&Value>, path: &Path, errs: &mut Vec<FieldError>) {
    let p = path.as_str();
    if v.is_null() {
        if schema["nullable"] != json!(true) {
            errs.push(FieldError::invalid(
                p,
                &json!("null"),
                format!("{p} in body must be of type {}: \"null\"", schema_type(schema)),
            ));
        }
        return;
    }
    if schema["x-kubernetes-int-or-string"] == json!(true) {
        if !(has_type(v, "integer") || v.is_string()) {
            errs.push(FieldError::invalid(
                p,
                &json!(type_name(v)),
                format!("{p} in body must be of type integer-or-string: \"{}\"", type_name(v)),
            ));
            return;
        }
    } else if let Some(ty) = schema["type"].as_str() {
        if !has_type(v, ty) {
            errs.push(FieldError::invalid(
                p,
                &json!(type_name(v)),
                format!("{p} in body must be of type {ty}: \"{}\"", type_name(v)),
            ));
            return;
        }
    }
    if let Some(allowed) = schema["enum"].as_array() {
        if !allowed.contains(v) {
            let supported: Vec<String> =
                allowed.iter().map(|a| a.as_str().map_or_else(|| a.to_string(), str::to_string)).collect();
            let supported: Vec<&str> = supported.iter().map(String::as_str).collect();
            errs.push(FieldError::not_supported(p, v, &supported));
        }
    }
    match v {
        Value::Number(_) => check_number(schema, v, p, errs),
        Value::String(s) => check_string(schema, v, s, p, errs),
        Value::Array(items) => {
            let n = items.len() as u64;
            if let Some(min) = schema["minItems"].as_u64().filter(|min| n < *min) {
                errs.push(FieldError::invalid(p, v, format!("{p} in body should have at least {min} items")));
            }
            if let Some(max) = schema["maxItems"].as_u64().filter(|max| n > *max) {
                errs.push(FieldError::invalid(p, v, format!("{p} in body should have at most {max} items")));
            }
            if let Some(s) = schema.get("items").filter(|s| s.is_object()) {
                for (i, item) in items.iter().enumerate() {
                    let old_item = old.and_then(|o| correlated_item(schema, item, o));
                    check(s, item, old_item, &path.index(i), errs);
                }
            }
        }
        Value::Object(m) => {
            let n = m.len() as u64;
            if let Some(min) = schema["minProperties"].as_u64().filter(|min| n < *min) {
                errs.push(FieldError::invalid(p, v, format!("{p} in body should have at least {min} properties")));
            }
            if let Some(max) = schema["maxProperties"].as_u64().filter(|max| n > *max) {
                errs.push(FieldError::invalid(p, v, format!("{p} in body should have at most {max} properties")));
            }
            for (k, child) in m {
                if let Ok(s) = field_schema(schema, k) {
                    let child_path = if schema.get("properties").and_then(|ps| ps.get(k)).is_some() {
                        path.child(k)
                    } else {
                        path.key(k)
                    };
                    check(s, child, old.and_then(|o| o.get(k)), &child_path, errs);
                }
            }
            check_required(schema, m, path, errs);
        }
        _ => {}
    }
    rules::evaluate(schema, v, old, path, errs);
}

/// The item of the old list that `item` continues: the one with the same
/// keys in a `map` list. Items of other lists have no identity across
/// writes, so transition rules do not run on them.
fn correlated_item<'a>(schema: &Value, item: &Value, old: &'a Value) -> Option<&'a Value> {
    if schema["x-kubernetes-list-type"] != "map" {
        return None;
    }
    let keys: Vec<&str> = schema["x-kubernetes-list-map-keys"].as_array()?.iter().filter_map(Value::as_str).collect();
    old.as_array()?.iter().find(|o| keys.iter().all(|k| o.get(k) == item.get(k)))
}

fn schema_type(schema: &Value) -> &str {
    schema["type"].as_str().unwrap_or("object")
}

fn check_number(schema: &Value, v: &Value, p: &str, errs: &mut Vec<FieldError>) {
    let x = v.as_f64().unwrap_or_default();
    if let Some(min) = schema["minimum"].as_f64() {
        let exclusive = schema["exclusiveMinimum"] == json!(true);
        if x < min || (exclusive && x == min) {
            let how = if exclusive { "greater than" } else { "greater than or equal to" };
            errs.push(FieldError::invalid(p, v, format!("{p} in body should be {how} {}", schema["minimum"])));
        }
    }
    if let Some(max) = schema["maximum"].as_f64() {
        let exclusive = schema["exclusiveMaximum"] == json!(true);
        if x > max || (exclusive && x == max) {
            let how = if exclusive { "less than" } else { "less than or equal to" };
            errs.push(FieldError::invalid(p, v, format!("{p} in body should be {how} {}", schema["maximum"])));
        }
    }
    if let Some(m) = schema["multipleOf"].as_f64().filter(|m| *m > 0.0) {
        if (x / m).fract() != 0.0 {
            errs.push(FieldError::invalid(
                p,
                v,
                format!("{p} in body should be a multiple of {}", schema["multipleOf"]),
            ));
        }
    }
}

fn check_string(schema: &Value, v: &Value, s: &str, p: &str, errs: &mut Vec<FieldError>) {
    let n = s.chars().count() as u64;
    if let Some(min) = schema["minLength"].as_u64().filter(|min| n < *min) {
        errs.push(FieldError::invalid(p, v, format!("{p} in body should be at least {min} chars long")));
    }
    if let Some(max) = schema["maxLength"].as_u64().filter(|max| n > *max) {
        errs.push(FieldError::too_long(p, max as usize));
    }
    if let Some(pattern) = schema["pattern"].as_str() {
        match regex::Regex::new(pattern) {
            Ok(re) if re.is_match(s) => {}
            Ok(_) => errs.push(FieldError::invalid(p, v, format!("{p} in body should match '{pattern}'"))),
            // An invalid pattern is refused when the CRD is written; one
            // that slipped through matches nothing.
            Err(_) => errs.push(FieldError::invalid(p, v, format!("the schema's pattern '{pattern}' is invalid"))),
        }
    }
}

// ---------------------------------------------------------------------------
// Table cells

/// The cells of `obj`'s row: its name, then each printer column's value
/// (dates as ages, as the apiserver prints them).
pub fn cells(info: &ResourceInfo, obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let c = custom(info);
    let mut out = vec![Value::from(crate::meta::name(obj).unwrap_or(""))];
    for (column, path) in c.columns[1..].iter().zip(&c.paths) {
        let found = json_path(obj, path);
        out.push(match (found, column.type_) {
            (None, _) => Value::Null,
            (Some(Value::String(t)), "date") => match DateTime::parse_from_rfc3339(t) {
                Ok(t) => Value::from(crate::meta::human_duration((now - t.with_timezone(&Utc)).num_seconds())),
                Err(_) => Value::from(t.as_str()),
            },
            (Some(v @ (Value::Object(_) | Value::Array(_))), _) => Value::from(v.to_string()),
            (Some(v), _) => v.clone(),
        });
    }
    out
}

/// The value a printer column's JSONPath names: `.spec.replicas`,
/// `.status.conditions[0].type`, with or without `{}` around it.
pub fn json_path<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    let path = path.trim();
    let path = path.strip_prefix('{').and_then(|p| p.strip_suffix('}')).unwrap_or(path);
    let mut current = obj;
    for segment in path.trim_start_matches('.').split('.').filter(|s| !s.is_empty()) {
        let (name, indexes) = match segment.find('[') {
            Some(i) => (&segment[..i], &segment[i..]),
            None => (segment, ""),
        };
        if !name.is_empty() {
            current = current.get(name)?;
        }
        for index in indexes.split('[').filter(|s| !s.is_empty()) {
            let index = index.strip_suffix(']')?;
            current = match index.parse::<i64>() {
                Ok(i) if i < 0 => {
                    let items = current.as_array()?;
                    items.get(items.len().checked_sub(i.unsigned_abs() as usize)?)?
                }
                Ok(i) => current.get(i as usize)?,
                Err(_) => current.get(index.trim_matches('\'').trim_matches('"'))?,
            };
        }
    }
    Some(current)
}

// ---------------------------------------------------------------------------
// Definitions

const COLUMN_TYPES: [&str; 5] = ["integer", "number", "string", "boolean", "date"];

/// Every problem with a CRD (normalized and defaulted); `old` is the stored
/// one on update.
pub fn validate_definition(crd: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let spec = &crd["spec"];
    let group = text(spec, "/group");
    let (plural, kind) = (text(spec, "/names/plural"), text(spec, "/names/kind"));
    let name = crate::meta::name(crd).unwrap_or_default();
    if group.is_empty() {
        errs.push(FieldError::required("spec.group", ""));
    } else if !is_dns1123_subdomain(group).is_empty() {
        errs.push(FieldError::invalid(
            "spec.group",
            &json!(group),
            "a DNS-1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'",
        ));
    } else if !group.contains('.') {
        errs.push(FieldError::invalid("spec.group", &json!(group), "should be a domain with at least one dot"));
    }
    if !plural.is_empty() && !group.is_empty() && name != format!("{plural}.{group}") {
        errs.push(FieldError::invalid("metadata.name", &json!(name), "must be spec.names.plural+\".\"+spec.group"));
    }
    let names = Path::new("spec").child("names");
    for (field, value) in [("plural", plural), ("singular", text(spec, "/names/singular"))] {
        if value.is_empty() {
            errs.push(FieldError::required(names.child(field).as_str(), ""));
        } else if !is_dns1035_label(value).is_empty() {
            errs.push(FieldError::invalid(
                names.child(field).as_str(),
                &json!(value),
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-'",
            ));
        }
    }
    for short in spec["names"]["shortNames"].as_array().into_iter().flatten() {
        if !short.as_str().is_some_and(|s| is_dns1035_label(s).is_empty()) {
            errs.push(FieldError::invalid(
                names.child("shortNames").as_str(),
                short,
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-'",
            ));
        }
    }
    for (field, value) in [("kind", kind), ("listKind", text(spec, "/names/listKind"))] {
        if value.is_empty() {
            errs.push(FieldError::required(names.child(field).as_str(), ""));
        } else if !value.chars().all(|c| c.is_ascii_alphanumeric())
            || !value.starts_with(|c: char| c.is_ascii_alphabetic())
        {
            errs.push(FieldError::invalid(
                names.child(field).as_str(),
                &json!(value),
                "may have mixed case, but should otherwise match: [a-z]([-a-z0-9]*[a-z0-9])?",
            ));
        }
    }
    match text(spec, "/scope") {
        "Namespaced" | "Cluster" => {}
        other => errs.push(FieldError::not_supported("spec.scope", &json!(other), &["Cluster", "Namespaced"])),
    }
    validate_versions(spec, &mut errs);
    if let Some(old) = old {
        if text(&old["spec"], "/scope") != text(spec, "/scope") {
            errs.push(FieldError::invalid("spec.scope", &spec["scope"], "field is immutable"));
        }
    }
    errs
}

fn validate_versions(spec: &Value, errs: &mut Vec<FieldError>) {
    let path = Path::new("spec").child("versions");
    let versions = spec["versions"].as_array().cloned().unwrap_or_default();
    if versions.is_empty() {
        errs.push(FieldError::invalid(
            path.as_str(),
            &spec["versions"],
            "must have exactly one version marked as storage version",
        ));
        return;
    }
    let storage = versions.iter().filter(|v| v["storage"] == json!(true)).count();
    if storage != 1 {
        errs.push(FieldError::invalid(
            path.as_str(),
            &json!(versions.iter().map(|v| v["name"].clone()).collect::<Vec<_>>()),
            "must have exactly one version marked as storage version",
        ));
    }
    if !versions.iter().any(|v| v["served"] == json!(true)) {
        errs.push(FieldError::invalid(path.as_str(), &json!(null), "must have at least one served version"));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, v) in versions.iter().enumerate() {
        let vp = path.index(i);
        let name = text(v, "/name");
        if !is_dns1035_label(name).is_empty() {
            errs.push(FieldError::invalid(
                vp.child("name").as_str(),
                &v["name"],
                "a DNS-1035 label must consist of lower case alphanumeric characters or '-'",
            ));
        } else if !seen.insert(name) {
            errs.push(FieldError::duplicate(vp.child("name").as_str(), &v["name"]));
        }
        let schema = v.pointer("/schema/openAPIV3Schema");
        match schema {
            None => errs.push(FieldError::required(
                vp.child("schema").child("openAPIV3Schema").as_str(),
                "schemas are required",
            )),
            Some(s) if s["type"] != "object" => errs.push(FieldError::invalid(
                vp.child("schema").child("openAPIV3Schema").child("type").as_str(),
                &s["type"],
                "must be object at the root",
            )),
            Some(s) => check_patterns(s, &vp.child("schema").child("openAPIV3Schema"), errs),
        }
        if let Some(scale) = v.pointer("/subresources/scale").filter(|s| !s.is_null()) {
            validate_scale(scale, &vp.child("subresources").child("scale"), errs);
        }
        for (j, c) in v["additionalPrinterColumns"].as_array().into_iter().flatten().enumerate() {
            let cp = vp.child("additionalPrinterColumns").index(j);
            if text(c, "/name").is_empty() {
                errs.push(FieldError::required(cp.child("name").as_str(), ""));
            }
            if !COLUMN_TYPES.contains(&text(c, "/type")) {
                errs.push(FieldError::not_supported(cp.child("type").as_str(), &c["type"], &COLUMN_TYPES));
            }
            if text(c, "/jsonPath").is_empty() {
                errs.push(FieldError::required(cp.child("jsonPath").as_str(), ""));
            }
        }
    }
}

/// A scale subresource's paths: simple field paths, the desired replicas
/// under `.spec`, the observed under `.status`, the selector under either.
fn validate_scale(scale: &Value, path: &Path, errs: &mut Vec<FieldError>) {
    let fields: [(&str, &[&str], bool); 3] = [
        ("specReplicasPath", &["spec"], true),
        ("statusReplicasPath", &["status"], true),
        ("labelSelectorPath", &["spec", "status"], false),
    ];
    for (field, roots, required) in fields {
        let at = path.child(field);
        match scale[field].as_str().filter(|p| !p.is_empty()) {
            None if required => errs.push(FieldError::required(at.as_str(), "")),
            None => {}
            Some(p) => {
                let ok = field_path(p).is_some_and(|segments| segments.len() > 1 && roots.contains(&segments[0]));
                if !ok {
                    let under = roots.iter().map(|r| format!(".{r}")).collect::<Vec<_>>().join(" or ");
                    errs.push(FieldError::invalid(
                        at.as_str(),
                        &json!(p),
                        format!("should be a json path under {under}"),
                    ));
                }
            }
        }
    }
}

/// Every `pattern` and every CEL rule of a schema must compile.
fn check_patterns(schema: &Value, path: &Path, errs: &mut Vec<FieldError>) {
    let Some(m) = schema.as_object() else {
        return;
    };
    rules::check_definition(schema, path, errs);
    if let Some(p) = m.get("pattern").and_then(Value::as_str) {
        if let Err(e) = regex::Regex::new(p) {
            errs.push(FieldError::invalid(path.child("pattern").as_str(), &json!(p), e.to_string()));
        }
    }
    for (k, s) in m.get("properties").and_then(Value::as_object).into_iter().flatten() {
        check_patterns(s, &path.child("properties").key(k), errs);
    }
    for key in ["items", "additionalProperties"] {
        if let Some(s) = m.get(key).filter(|s| s.is_object()) {
            check_patterns(s, &path.child(key), errs);
        }
    }
}

/// Fills in a CRD's defaults: the singular and list kind from the kind, and
/// conversion `None`.
pub fn default_definition(crd: &mut Value) {
    let spec = &mut crd["spec"];
    if !spec.is_object() {
        return;
    }
    let kind = text(spec, "/names/kind").to_string();
    if spec["names"].is_object() {
        if text(spec, "/names/singular").is_empty() && !kind.is_empty() {
            spec["names"]["singular"] = json!(kind.to_ascii_lowercase());
        }
        if text(spec, "/names/listKind").is_empty() && !kind.is_empty() {
            spec["names"]["listKind"] = json!(format!("{kind}List"));
        }
    }
    if spec["conversion"].is_null() {
        spec["conversion"] = json!({"strategy": "None"});
    }
    if spec["scope"].is_null() {
        spec["scope"] = json!("Namespaced");
    }
}

/// A CRD's status as the apiserver keeps it: the names accepted, the
/// versions ever stored, and `NamesAccepted` and `Established` true (the
/// resource is served as soon as the definition is stored). Conditions
/// keep their transition times while they hold.
pub fn status_of(crd: &Value, old_status: Option<&Value>, now: &str) -> Value {
    let spec = &crd["spec"];
    let mut names = spec["names"].clone();
    if names.is_object() {
        names["singular"] = json!(singular(spec));
        if text(spec, "/names/listKind").is_empty() {
            names["listKind"] = json!(format!("{}List", text(spec, "/names/kind")));
        }
    }
    let mut stored: Vec<Value> = old_status.and_then(|s| s["storedVersions"].as_array().cloned()).unwrap_or_default();
    for v in spec["versions"].as_array().into_iter().flatten().filter(|v| v["storage"] == json!(true)) {
        if !stored.contains(&v["name"]) {
            stored.push(v["name"].clone());
        }
    }
    let condition = |type_: &str, reason: &str, message: &str| {
        let since = old_status
            .and_then(|s| s["conditions"].as_array())
            .into_iter()
            .flatten()
            .find(|c| c["type"] == type_ && c["status"] == "True")
            .map(|c| c["lastTransitionTime"].clone())
            .unwrap_or_else(|| json!(now));
        json!({"type": type_, "status": "True", "reason": reason, "message": message, "lastTransitionTime": since})
    };
    json!({
        "acceptedNames": names,
        "storedVersions": stored,
        "conditions": [
            condition("NamesAccepted", "NoConflicts", "no conflicts found"),
            condition("Established", "InitialNamesAccepted", "the initial names have been accepted"),
        ],
    })
}

mod rules;

#[cfg(test)]
mod tests;
