//! A decoded Kubernetes protobuf message as the JSON Go would write for it.
//!
//! Fields are walked in field-number order and named by their JSON names
//! (which equal the proto names except for inlined fields). The apimachinery
//! wrapper messages get their JSON forms: `Quantity` → string, `IntOrString`
//! → int or string, `Time`/`MicroTime` → RFC 3339 (`null` when zero),
//! `Duration` → Go duration string, `RawExtension`/`FieldsV1` → the embedded
//! JSON, and `bytes` → base64.

use base64::Engine as _;
use chrono::{DateTime, Datelike, Utc};
use prost_reflect::{DynamicMessage, MapKey, ReflectMessage, Value as PValue};
use serde_json::{Map, Number, Value};

use super::go::{self, INLINE, OMITEMPTY, POINTER};

const QUANTITY: &str = "k8s.io.apimachinery.pkg.api.resource.Quantity";
const QUANTITY_VALUE: &str = "k8s.io.apimachinery.pkg.api.resource.QuantityValue";
const INT_OR_STRING: &str = "k8s.io.apimachinery.pkg.util.intstr.IntOrString";
const TIME: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.Time";
const MICRO_TIME: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.MicroTime";
const DURATION: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.Duration";
const FIELDS_V1: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.FieldsV1";
const RAW_EXTENSION: &str = "k8s.io.apimachinery.pkg.runtime.RawExtension";

/// A conversion failure at a JSON path (`spec.template.metadata.creationTimestamp`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ConvertError {
    pub path: String,
    pub message: String,
}

impl ConvertError {
    fn new(message: impl Into<String>) -> Self {
        ConvertError { path: String::new(), message: message.into() }
    }

    fn under(mut self, segment: &str) -> Self {
        self.path = if self.path.is_empty() {
            segment.to_string()
        } else if self.path.starts_with('[') {
            format!("{segment}{}", self.path)
        } else {
            format!("{segment}.{}", self.path)
        };
        self
    }
}

type Result<T> = std::result::Result<T, ConvertError>;

/// The JSON for `msg`.
pub(super) fn message(msg: &DynamicMessage) -> Result<Value> {
    let desc = msg.descriptor();
    match desc.full_name() {
        // Go's zero Quantity (nothing set) is "0"; the string is not re-canonicalised here.
        QUANTITY | QUANTITY_VALUE => {
            Ok(Value::String(string_field(msg, 1).filter(|s| !s.is_empty()).unwrap_or_else(|| "0".to_string())))
        }
        INT_OR_STRING => Ok(int_or_string(msg)),
        TIME => time(msg, false),
        MICRO_TIME => time(msg, true),
        DURATION => Ok(Value::String(go_duration(int_field(msg, 1)))),
        FIELDS_V1 | RAW_EXTENSION => embedded_json(msg),
        name if go::unwraps_items(name) => match desc.get_field(1) {
            Some(fd) => field_value(&msg.get_field(&fd)),
            None => Ok(Value::Array(Vec::new())),
        },
        _ => Ok(Value::Object(object(msg)?)),
    }
}

/// The fields of a Go struct message, with inlined fields merged in.
fn object(msg: &DynamicMessage) -> Result<Map<String, Value>> {
    let desc = msg.descriptor();
    let mut out = Map::new();
    for fd in desc.fields() {
        if !msg.has_field(&fd) {
            continue;
        }
        let go = go::field(desc.full_name(), fd.number());
        let flags = go.map_or(OMITEMPTY, |g| g.flags);
        let name = match go {
            Some(g) if !g.has(INLINE) => g.json,
            Some(_) => "",
            None => fd.name(),
        };
        let value = msg.get_field(&fd);
        // Go writes every non-pointer scalar; only the JSON tag decides whether a zero shows.
        if flags & OMITEMPTY != 0 && flags & POINTER == 0 && is_zero_scalar(&value) {
            continue;
        }
        let json = field_value(&value).map_err(|e| e.under(if name.is_empty() { fd.name() } else { name }))?;
        if flags & INLINE != 0 {
            if let Value::Object(inner) = json {
                out.extend(inner);
                continue;
            }
        }
        out.insert(if name.is_empty() { fd.name() } else { name }.to_string(), json);
    }
    Ok(out)
}

fn is_zero_scalar(value: &PValue) -> bool {
    match value {
        PValue::Bool(b) => !b,
        PValue::I32(n) | PValue::EnumNumber(n) => *n == 0,
        PValue::I64(n) => *n == 0,
        PValue::U32(n) => *n == 0,
        PValue::U64(n) => *n == 0,
        PValue::F32(n) => *n == 0.0,
        PValue::F64(n) => *n == 0.0,
        PValue::String(s) => s.is_empty(),
        PValue::Bytes(b) => b.is_empty(),
        PValue::Message(_) | PValue::List(_) | PValue::Map(_) => false,
    }
}

/// The JSON for a field's value: a list, a map or a single value.
fn field_value(value: &PValue) -> Result<Value> {
    match value {
        PValue::List(items) => items
            .iter()
            .enumerate()
            .map(|(i, v)| single(v).map_err(|e| e.under(&format!("[{i}]"))))
            .collect::<Result<Vec<_>>>()
            .map(Value::Array),
        PValue::Map(entries) => {
            let mut keys: Vec<(String, &PValue)> = entries.iter().map(|(k, v)| (map_key(k), v)).collect();
            keys.sort_by(|a, b| a.0.cmp(&b.0));
            let mut out = Map::new();
            for (k, v) in keys {
                let json = single(v).map_err(|e| e.under(&format!("[{k:?}]")))?;
                out.insert(k, json);
            }
            Ok(Value::Object(out))
        }
        other => single(other),
    }
}

fn map_key(key: &MapKey) -> String {
    match key {
        MapKey::Bool(b) => b.to_string(),
        MapKey::I32(n) => n.to_string(),
        MapKey::I64(n) => n.to_string(),
        MapKey::U32(n) => n.to_string(),
        MapKey::U64(n) => n.to_string(),
        MapKey::String(s) => s.clone(),
    }
}

/// The JSON for one non-repeated value.
fn single(value: &PValue) -> Result<Value> {
    Ok(match value {
        PValue::Bool(b) => Value::Bool(*b),
        PValue::I32(n) | PValue::EnumNumber(n) => Value::from(*n),
        PValue::I64(n) => Value::from(*n),
        PValue::U32(n) => Value::from(*n),
        PValue::U64(n) => Value::from(*n),
        PValue::F32(n) => float(f64::from(*n))?,
        PValue::F64(n) => float(*n)?,
        PValue::String(s) => Value::String(s.clone()),
        PValue::Bytes(b) => Value::String(base64::engine::general_purpose::STANDARD.encode(b)),
        PValue::Message(m) => message(m)?,
        PValue::List(_) | PValue::Map(_) => return Err(ConvertError::new("nested list or map")),
    })
}

fn float(n: f64) -> Result<Value> {
    Number::from_f64(n).map(Value::Number).ok_or_else(|| ConvertError::new(format!("{n} is not a JSON number")))
}

fn string_field(msg: &DynamicMessage, number: u32) -> Option<String> {
    match msg.get_field_by_number(number).as_deref() {
        Some(PValue::String(s)) => Some(s.clone()),
        _ => None,
    }
}

fn int_field(msg: &DynamicMessage, number: u32) -> i64 {
    match msg.get_field_by_number(number).as_deref() {
        Some(PValue::I64(n)) => *n,
        Some(PValue::I32(n)) => i64::from(*n),
        _ => 0,
    }
}

/// `intstr.IntOrString{type, intVal, strVal}`: type 1 is a string, anything else an int (as Go decides).
fn int_or_string(msg: &DynamicMessage) -> Value {
    if int_field(msg, 1) == 1 {
        Value::String(string_field(msg, 3).unwrap_or_default())
    } else {
        Value::from(int_field(msg, 2))
    }
}

/// `meta.v1.Time` / `MicroTime` `{seconds, nanos}`. An empty message is Go's zero
/// time, which it writes as `null`; otherwise RFC 3339 in UTC, to the second for
/// `Time` and the microsecond for `MicroTime`.
fn time(msg: &DynamicMessage, micro: bool) -> Result<Value> {
    if !msg.fields().any(|_| true) {
        return Ok(Value::Null);
    }
    let seconds = int_field(msg, 1);
    let nanos = int_field(msg, 2);
    // time.Unix normalises nanoseconds outside [0, 1e9).
    let t = seconds
        .checked_add(nanos.div_euclid(1_000_000_000))
        .and_then(|s| DateTime::<Utc>::from_timestamp(s, u32::try_from(nanos.rem_euclid(1_000_000_000)).ok()?))
        .filter(|t| (0..=9999).contains(&t.year()))
        .ok_or_else(|| ConvertError::new(format!("time {seconds}s {nanos}ns is out of range")))?;
    let format = if micro { "%Y-%m-%dT%H:%M:%S%.6fZ" } else { "%Y-%m-%dT%H:%M:%SZ" };
    Ok(Value::String(t.format(format).to_string()))
}

/// `RawExtension{raw}` / `FieldsV1{Raw}`: the bytes are the JSON itself (`null` when absent).
fn embedded_json(msg: &DynamicMessage) -> Result<Value> {
    match msg.get_field_by_number(1).as_deref() {
        Some(PValue::Bytes(raw)) if !raw.is_empty() => serde_json::from_slice(raw).map_err(|e| {
            ConvertError::new(format!(
                "embedded object is not JSON (protobuf-encoded extensions are not supported): {e}"
            ))
        }),
        _ => Ok(Value::Null),
    }
}

/// Go's `time.Duration.String()`: `1h2m3.5s`, `250ms`, `0s`.
pub(super) fn go_duration(d: i64) -> String {
    fn frac(v: u64, prec: u32) -> (String, u64) {
        let scale = 10u64.pow(prec);
        let digits = format!("{:0width$}", v % scale, width = prec as usize);
        let digits = digits.trim_end_matches('0');
        (if digits.is_empty() { String::new() } else { format!(".{digits}") }, v / scale)
    }
    let sign = if d < 0 { "-" } else { "" };
    let u = d.unsigned_abs();
    let body = if u < 1_000_000_000 {
        let (prec, unit) = match u {
            0 => return "0s".to_string(),
            1..=999 => (0, "ns"),
            1_000..=999_999 => (3, "µs"),
            _ => (6, "ms"),
        };
        let (f, whole) = frac(u, prec);
        format!("{whole}{f}{unit}")
    } else {
        let (f, secs) = frac(u, 9);
        let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
        if h > 0 {
            format!("{h}h{m}m{s}{f}s")
        } else if m > 0 {
            format!("{m}m{s}{f}s")
        } else {
            format!("{s}{f}s")
        }
    };
    format!("{sign}{body}")
}
