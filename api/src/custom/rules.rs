//! `x-kubernetes-validations`: the CEL rules a CRD's schema attaches to its
//! nodes, checked when the CRD is written ([`check_definition`]) and
//! evaluated on every write of its objects ([`evaluate`]), as
//! apiextensions-apiserver does.
//!
//! A rule sees the value at its node as `self`, converted by the node's
//! schema: integers as `int`, numbers as `double`, `date-time` strings as
//! timestamps, declared properties under their escaped names (`__dash__`,
//! `__dot__`, ...). A rule that names `oldSelf` is a transition rule: it runs
//! only on an update whose old object has a value at the same place (an
//! object's property, a map's key, a `map` list's item with the same keys),
//! or, with `optionalOldSelf`, on every write with `oldSelf` an optional.
//!
//! The language is cel-rust's: CEL's standard library, the strings and
//! lists extensions and optionals. It has no type checker, so where
//! Kubernetes refuses a CRD whose rule names a field its schema lacks, Skiff
//! refuses the object when the rule runs (`no such key`), as Kubernetes does
//! for an optional field that is unset. Kubernetes' own libraries
//! (`quantity`, `url`, `ip`, `cidr`, `isSorted`, ...) are refused when the
//! CRD is written, by name. Rules have no cost budget: an object's size
//! bounds what they can iterate.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, LazyLock, Mutex};

use cel::common::ast::{EntryExpr, Expr};
use cel::objects::OptionalValue;
use cel::{Context, Env, IdedExpr as Expression, Program};
use serde_json::{json, Value};

use crate::field::{FieldError, Path};

const RULES: &str = "x-kubernetes-validations";

const REASONS: [&str; 4] = ["FieldValueDuplicate", "FieldValueForbidden", "FieldValueInvalid", "FieldValueRequired"];

/// Functions of Kubernetes' CEL libraries that cel-rust does not have: a
/// rule that calls one is refused with its name, not when an object meets it.
const KUBERNETES_ONLY: &[&str] = &[
    "quantity",
    "isQuantity",
    "url",
    "isURL",
    "ip",
    "isIP",
    "cidr",
    "isCIDR",
    "isSorted",
    "sum",
    "semver",
    "isSemver",
    "authorizer",
    "validate",
];

/// The names CEL programs may use without declaring them: the type names.
const TYPE_NAMES: &[&str] = &["bool", "bytes", "double", "int", "list", "map", "null_type", "string", "type", "uint"];

static ENV: LazyLock<Arc<Env>> = LazyLock::new(|| {
    let mut env = Env::stdlib();
    env.add_extension(cel::extensions::strings).expect("the strings extension declares once");
    env.add_extension(cel::extensions::lists).expect("the lists extension declares once");
    Arc::new(env)
});

/// Compiled programs by source. A CRD's rules run on every write of its
/// objects; they are few, so the cache is only emptied when it grows past
/// what any set of CRDs plausibly holds.
static PROGRAMS: LazyLock<Mutex<HashMap<String, Arc<Program>>>> = LazyLock::new(Default::default);

const MAX_PROGRAMS: usize = 4096;

fn compile(source: &str) -> Result<Arc<Program>, String> {
    if let Some(p) = PROGRAMS.lock().expect("program cache").get(source) {
        return Ok(p.clone());
    }
    let program = Arc::new(ENV.compile(source).map_err(|e| e.to_string())?);
    let mut cache = PROGRAMS.lock().expect("program cache");
    if cache.len() >= MAX_PROGRAMS {
        cache.clear();
    }
    cache.insert(source.to_string(), program.clone());
    Ok(program)
}

/// The variables `expr` reads that no comprehension around them binds.
fn free_variables<'e>(expr: &'e Expression, bound: &mut Vec<&'e str>, out: &mut BTreeSet<&'e str>) {
    match &expr.expr {
        Expr::Unspecified | Expr::Literal(_) => {}
        Expr::Ident(name) => {
            if !name.starts_with('@') && !bound.contains(&name.as_str()) {
                out.insert(name.as_str());
            }
        }
        Expr::Call(call) => {
            for e in call.target.iter().map(|t| &**t).chain(&call.args) {
                free_variables(e, bound, out);
            }
        }
        Expr::Select(select) => free_variables(&select.operand, bound, out),
        Expr::List(list) => list.elements.iter().for_each(|e| free_variables(e, bound, out)),
        Expr::Map(map) => entries(map.entries.iter().map(|e| &e.expr), bound, out),
        Expr::Struct(s) => entries(s.entries.iter().map(|e| &e.expr), bound, out),
        Expr::Comprehension(c) => {
            free_variables(&c.iter_range, bound, out);
            free_variables(&c.accu_init, bound, out);
            let depth = bound.len();
            bound.push(&c.iter_var);
            bound.extend(c.iter_var2.as_deref());
            bound.push(&c.accu_var);
            for e in [&c.loop_cond, &c.loop_step, &c.result] {
                free_variables(e, bound, out);
            }
            bound.truncate(depth);
        }
    }
}

fn entries<'e>(entries: impl Iterator<Item = &'e EntryExpr>, bound: &mut Vec<&'e str>, out: &mut BTreeSet<&'e str>) {
    for entry in entries {
        match entry {
            EntryExpr::StructField(f) => free_variables(&f.value, bound, out),
            EntryExpr::MapEntry(m) => {
                free_variables(&m.key, bound, out);
                free_variables(&m.value, bound, out);
            }
        }
    }
}

/// What a compiled rule reads: whether it names `oldSelf`, or the first
/// problem that keeps it from running.
fn analyse(program: &Program) -> Result<bool, String> {
    let mut free = BTreeSet::new();
    free_variables(program.expression(), &mut Vec::new(), &mut free);
    if let Some(name) = free.iter().find(|v| !matches!(**v, "self" | "oldSelf") && !TYPE_NAMES.contains(v)) {
        return Err(format!("undeclared reference to '{name}'"));
    }
    let references = program.references();
    if let Some(f) = KUBERNETES_ONLY.iter().find(|f| references.has_function(f)) {
        return Err(format!("'{f}' of Kubernetes' CEL libraries is not supported by this server"));
    }
    Ok(free.contains("oldSelf"))
}

// ---------------------------------------------------------------------------
// Definitions

/// Every problem with the rules at one schema node, whose path is `path`.
pub(super) fn check_definition(schema: &Value, path: &Path, errs: &mut Vec<FieldError>) {
    let Some(rules) = schema.get(RULES) else {
        return;
    };
    let Some(rules) = rules.as_array() else {
        errs.push(FieldError::invalid(path.child(RULES).as_str(), rules, "must be a list of rules"));
        return;
    };
    for (i, rule) in rules.iter().enumerate() {
        let at = path.child(RULES).index(i);
        let source = rule["rule"].as_str().unwrap_or_default();
        let uses_old_self = if source.trim().is_empty() {
            errs.push(FieldError::required(at.child("rule").as_str(), ""));
            None
        } else {
            match compile(source).and_then(|p| analyse(&p)) {
                Ok(old) => Some(old),
                Err(e) => {
                    errs.push(FieldError::invalid(
                        at.child("rule").as_str(),
                        &json!(source),
                        format!("compilation failed: {e}"),
                    ));
                    None
                }
            }
        };
        if rule["optionalOldSelf"] == json!(true) && uses_old_self == Some(false) {
            errs.push(FieldError::invalid(
                at.child("optionalOldSelf").as_str(),
                &json!(true),
                "may not be set if rule does not use oldSelf",
            ));
        }
        if let Some(message) = rule["message"].as_str() {
            if message.contains(['\n', '\r']) {
                errs.push(FieldError::invalid(
                    at.child("message").as_str(),
                    &json!(message),
                    "message must not contain line breaks",
                ));
            }
        }
        if let Some(expression) = rule["messageExpression"].as_str().filter(|e| !e.trim().is_empty()) {
            if let Err(e) = compile(expression).and_then(|p| analyse(&p)) {
                errs.push(FieldError::invalid(
                    at.child("messageExpression").as_str(),
                    &json!(expression),
                    format!("messageExpression compilation failed: {e}"),
                ));
            }
        }
        if let Some(reason) = rule.get("reason").filter(|r| !r.is_null()) {
            if !reason.as_str().is_some_and(|r| REASONS.contains(&r)) {
                errs.push(FieldError::not_supported(at.child("reason").as_str(), reason, &REASONS));
            }
        }
        if let Some(field_path) = rule["fieldPath"].as_str().filter(|p| !p.is_empty()) {
            if let Err(e) = resolve_field_path(schema, field_path) {
                errs.push(FieldError::invalid(at.child("fieldPath").as_str(), &json!(field_path), e));
            }
        }
    }
}

/// The segments of a rule's `fieldPath` (`.spec.replicas`, `.labels['a.b']`),
/// each a property the schema declares or a key of a map it allows, with
/// whether it was written as a key (`['a.b']`).
fn resolve_field_path(schema: &Value, path: &str) -> Result<Vec<(String, bool)>, String> {
    let mut segments = Vec::new();
    let mut rest = path;
    let mut at = schema;
    while !rest.is_empty() {
        let (segment, tail, is_key) = if let Some(r) = rest.strip_prefix("['") {
            let end = r.find("']").ok_or("fieldPath must be a valid path: unterminated ['")?;
            (&r[..end], &r[end + 2..], true)
        } else if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            (&r[..end], &r[end..], false)
        } else {
            return Err("fieldPath must be a valid path".into());
        };
        if segment.is_empty() {
            return Err("fieldPath must be a valid path".into());
        }
        at = match (at["properties"].get(segment), at.get("additionalProperties")) {
            (Some(s), _) => s,
            (None, Some(s)) if s.is_object() => s,
            _ => return Err(format!("fieldPath must be a valid path: does not refer to a valid field: {segment}")),
        };
        segments.push((segment.to_string(), is_key));
        rest = tail;
    }
    Ok(segments)
}

// ---------------------------------------------------------------------------
// Objects

/// Runs the rules at one schema node on `value` (of the node's type), with
/// the correlated old value on an update, adding an error for each rule
/// that does not hold.
pub(super) fn evaluate(schema: &Value, value: &Value, old: Option<&Value>, path: &Path, errs: &mut Vec<FieldError>) {
    let Some(rules) = schema.get(RULES).and_then(Value::as_array) else {
        return;
    };
    let mut this = None;
    for rule in rules {
        let Some(source) = rule["rule"].as_str() else { continue };
        // A rule that does not compile was refused with its CRD; one stored
        // before this server checked it fails every write it would judge.
        let (program, uses_old_self) = match compile(source).and_then(|p| analyse(&p).map(|old| (p, old))) {
            Ok(p) => p,
            Err(e) => {
                errs.push(invalid(schema, value, path, format!("compilation failed: {e} evaluating rule: {source}")));
                continue;
            }
        };
        let optional_old = rule["optionalOldSelf"] == json!(true);
        if uses_old_self && old.is_none() && !optional_old {
            continue;
        }
        let mut ctx = Context::with_env(ENV.clone());
        ctx.add_variable_from_value("self", this.get_or_insert_with(|| to_cel(schema, value)).clone());
        if uses_old_self {
            let old = old.map(|o| to_cel(schema, o));
            if optional_old {
                let optional = match old {
                    Some(o) => OptionalValue::of(o),
                    None => OptionalValue::none(),
                };
                ctx.add_variable_from_value("oldSelf", cel::Value::Opaque(Arc::new(optional)));
            } else {
                ctx.add_variable_from_value("oldSelf", old.unwrap_or(cel::Value::Null));
            }
        }
        let message = match program.execute(&ctx) {
            Ok(cel::Value::Bool(true)) => continue,
            Ok(cel::Value::Bool(false)) => failure_message(rule, source, &ctx),
            Ok(other) => {
                errs.push(invalid(
                    schema,
                    value,
                    path,
                    format!("rule evaluated to {other:?}, not a bool, evaluating rule: {source}"),
                ));
                continue;
            }
            Err(e) => {
                errs.push(invalid(schema, value, path, format!("{e} evaluating rule: {source}")));
                continue;
            }
        };
        let mut at = path.clone();
        if let Some(field_path) = rule["fieldPath"].as_str().filter(|p| !p.is_empty()) {
            for (segment, is_key) in resolve_field_path(schema, field_path).unwrap_or_default() {
                at = if is_key { at.key(&segment) } else { at.child(&segment) };
            }
        }
        errs.push(match rule["reason"].as_str().unwrap_or("FieldValueInvalid") {
            "FieldValueForbidden" => FieldError::forbidden(at.as_str(), message),
            "FieldValueRequired" => FieldError::required(at.as_str(), message),
            "FieldValueDuplicate" => {
                FieldError { detail: message, ..FieldError::duplicate(at.as_str(), &json!(type_of(schema, value))) }
            }
            _ => invalid(schema, value, &at, message),
        });
    }
}

/// A failed rule's message: its `messageExpression` when that gives a
/// non-empty string, else its `message`, else `failed rule: <rule>`.
fn failure_message(rule: &Value, source: &str, ctx: &Context) -> String {
    let from_expression =
        rule["messageExpression"].as_str().filter(|e| !e.trim().is_empty()).and_then(|e| compile(e).ok()).and_then(
            |p| match p.execute(ctx) {
                Ok(cel::Value::String(s)) if !s.trim().is_empty() && !s.contains('\n') => Some(s.to_string()),
                _ => None,
            },
        );
    from_expression
        .or_else(|| rule["message"].as_str().filter(|m| !m.is_empty()).map(str::to_string))
        .unwrap_or_else(|| format!("failed rule: {source}"))
}

/// Kubernetes reports a rule's value by its schema type: `Invalid value:
/// "object": ...`.
fn type_of<'a>(schema: &'a Value, value: &Value) -> &'a str {
    schema["type"].as_str().unwrap_or(match value {
        Value::Object(_) => "object",
        Value::Array(_) => "array",
        Value::String(_) => "string",
        Value::Number(_) => "number",
        Value::Bool(_) => "boolean",
        Value::Null => "null",
    })
}

fn invalid(schema: &Value, value: &Value, path: &Path, message: String) -> FieldError {
    FieldError::invalid(path.as_str(), &json!(type_of(schema, value)), message)
}

/// `value` as CEL sees it, typed by `schema` (`Value::Null` where the
/// schema says nothing, as under `x-kubernetes-preserve-unknown-fields`).
pub(super) fn to_cel(schema: &Value, value: &Value) -> cel::Value {
    match value {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) => match (schema["type"].as_str(), n.as_i64()) {
            (Some("number"), _) | (_, None) => cel::Value::Float(n.as_f64().unwrap_or_default()),
            (_, Some(i)) => cel::Value::Int(i),
        },
        Value::String(s) => match schema["format"].as_str() {
            Some("date-time") => match chrono::DateTime::parse_from_rfc3339(s) {
                Ok(t) => cel::Value::Timestamp(t),
                Err(_) => cel::Value::from(s.as_str()),
            },
            _ => cel::Value::from(s.as_str()),
        },
        Value::Array(items) => {
            let item_schema = schema.get("items").unwrap_or(&Value::Null);
            cel::Value::List(Arc::new(items.iter().map(|i| to_cel(item_schema, i)).collect()))
        }
        Value::Object(m) => {
            let properties = schema.get("properties");
            let additional = schema.get("additionalProperties").filter(|a| a.is_object()).unwrap_or(&Value::Null);
            let mut out = HashMap::with_capacity(m.len());
            for (k, v) in m {
                match properties.and_then(|p| p.get(k)) {
                    Some(s) => {
                        if let Some(name) = escape(k) {
                            out.insert(name, to_cel(s, v));
                        }
                    }
                    None => {
                        out.insert(k.clone(), to_cel(additional, v));
                    }
                }
            }
            out.into()
        }
    }
}

const RESERVED: &[&str] = &[
    "true",
    "false",
    "null",
    "in",
    "as",
    "break",
    "const",
    "continue",
    "else",
    "for",
    "function",
    "if",
    "import",
    "let",
    "loop",
    "package",
    "namespace",
    "return",
    "var",
    "void",
    "while",
];

/// A declared property's name in CEL, escaped as Kubernetes escapes it
/// (`x-y` is `x__dash__y`, `if` is `__if__`); `None` for a name that cannot
/// be an identifier even escaped, which rules cannot see.
pub(super) fn escape(name: &str) -> Option<String> {
    if RESERVED.contains(&name) {
        return Some(format!("__{name}__"));
    }
    let escaped = name
        .replace("__", "__underscores__")
        .replace('.', "__dot__")
        .replace('-', "__dash__")
        .replace('/', "__slash__");
    let mut chars = escaped.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    (first_ok && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')).then_some(escaped)
}

/// The object as rules at the schema's root see it: its own fields, with
/// only `name` and `generateName` of its metadata, as Kubernetes exposes.
pub(super) fn root_view(obj: &Value) -> Value {
    let mut view = obj.clone();
    if let Some(m) = view.as_object_mut() {
        let mut metadata = serde_json::Map::new();
        for key in ["name", "generateName"] {
            if let Some(v) = obj["metadata"].get(key) {
                metadata.insert(key.into(), v.clone());
            }
        }
        m.insert("metadata".into(), Value::Object(metadata));
    }
    view
}

#[cfg(test)]
mod tests;
