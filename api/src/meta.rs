//! Reading and writing an object's `metadata` on its JSON form, for the code
//! that handles every kind alike (the registry, watch fan-out, tables).

use std::collections::BTreeMap;

use serde_json::{Map, Value};

fn meta(obj: &Value) -> Option<&Map<String, Value>> {
    obj.get("metadata")?.as_object()
}

fn str_field<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    meta(obj)?.get(field)?.as_str()
}

/// `metadata`, created if missing. Panics only if `obj` is not an object,
/// which the registry has ruled out before calling.
pub fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    let root = obj.as_object_mut().expect("objects are JSON objects");
    let m = root.entry("metadata").or_insert_with(|| Value::Object(Map::new()));
    if !m.is_object() {
        *m = Value::Object(Map::new());
    }
    m.as_object_mut().expect("just made an object")
}

pub fn name(obj: &Value) -> Option<&str> {
    str_field(obj, "name").filter(|s| !s.is_empty())
}

pub fn generate_name(obj: &Value) -> Option<&str> {
    str_field(obj, "generateName").filter(|s| !s.is_empty())
}

pub fn namespace(obj: &Value) -> Option<&str> {
    str_field(obj, "namespace").filter(|s| !s.is_empty())
}

pub fn uid(obj: &Value) -> Option<&str> {
    str_field(obj, "uid").filter(|s| !s.is_empty())
}

pub fn resource_version(obj: &Value) -> Option<&str> {
    str_field(obj, "resourceVersion").filter(|s| !s.is_empty())
}

pub fn deletion_timestamp(obj: &Value) -> Option<&str> {
    str_field(obj, "deletionTimestamp")
}

pub fn generation(obj: &Value) -> i64 {
    meta(obj).and_then(|m| m.get("generation")).and_then(Value::as_i64).unwrap_or(0)
}

pub fn labels(obj: &Value) -> BTreeMap<String, String> {
    string_map(obj, "labels")
}

pub fn annotations(obj: &Value) -> BTreeMap<String, String> {
    string_map(obj, "annotations")
}

fn string_map(obj: &Value, field: &str) -> BTreeMap<String, String> {
    meta(obj)
        .and_then(|m| m.get(field))
        .and_then(Value::as_object)
        .map(|m| m.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string()))).collect())
        .unwrap_or_default()
}

pub fn finalizers(obj: &Value) -> Vec<String> {
    meta(obj)
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

pub fn set_finalizers(obj: &mut Value, finalizers: &[String]) {
    let m = meta_mut(obj);
    if finalizers.is_empty() {
        m.remove("finalizers");
    } else {
        m.insert("finalizers".into(), Value::from(finalizers.to_vec()));
    }
}

pub fn set_str(obj: &mut Value, field: &str, value: &str) {
    meta_mut(obj).insert(field.to_string(), Value::String(value.to_string()));
}

pub fn set_resource_version(obj: &mut Value, revision: i64) {
    set_str(obj, "resourceVersion", &revision.to_string());
}

/// The part of an object that is neither metadata nor status: what
/// `generation` counts changes of.
pub fn spec_part(obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Some(m) = v.as_object_mut() {
        m.remove("metadata");
        m.remove("status");
        m.remove("kind");
        m.remove("apiVersion");
    }
    v
}

/// The current time as Kubernetes writes timestamps (`2024-01-02T03:04:05Z`).
pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// `5s`, `3m`, `2d4h`: an age as kubectl prints it (apimachinery's
/// `duration.HumanDuration`, rule for rule).
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    let s = seconds.max(0);
    if s < 120 {
        return format!("{s}s");
    }
    let minutes = s / 60;
    if minutes < 10 {
        let r = s % 60;
        return if r == 0 { format!("{minutes}m") } else { format!("{minutes}m{r}s") };
    }
    if minutes < 3 * 60 {
        return format!("{minutes}m");
    }
    let hours = s / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 { format!("{hours}h") } else { format!("{hours}h{m}m") };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let (d, h) = (hours / 24, hours % 24);
        return if h == 0 { format!("{d}d") } else { format!("{d}d{h}h") };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    let years = hours / 24 / 365;
    if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        return if dy == 0 { format!("{years}y") } else { format!("{years}y{dy}d") };
    }
    format!("{years}y")
}

/// The age of an object at `now`, from its `creationTimestamp`; `<unknown>`
/// if it has none.
pub fn age(obj: &Value, now: chrono::DateTime<chrono::Utc>) -> String {
    str_field(obj, "creationTimestamp")
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .map(|t| human_duration((now - t.with_timezone(&chrono::Utc)).num_seconds()))
        .unwrap_or_else(|| "<unknown>".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_metadata_of_any_object() {
        let obj = json!({"metadata": {"name": "a", "namespace": "ns", "labels": {"app": "web"}, "finalizers": ["x"]}});
        assert_eq!(name(&obj), Some("a"));
        assert_eq!(namespace(&obj), Some("ns"));
        assert_eq!(labels(&obj).get("app").map(String::as_str), Some("web"));
        assert_eq!(finalizers(&obj), vec!["x".to_string()]);
        assert_eq!(name(&json!({})), None);
    }

    #[test]
    fn ages_read_like_kubectl() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(150), "2m30s");
        assert_eq!(human_duration(3600 * 2 + 60 * 5), "125m");
        assert_eq!(human_duration(3600 * 5 + 60 * 5), "5h5m");
        assert_eq!(human_duration(86400 * 3 + 3600), "3d1h");
        assert_eq!(human_duration(86400 * 30), "30d");
    }

    #[test]
    fn spec_part_ignores_metadata_and_status() {
        let a = json!({"metadata": {"name": "a"}, "spec": {"x": 1}, "status": {"y": 1}});
        let b = json!({"metadata": {"name": "a", "labels": {"l": "v"}}, "spec": {"x": 1}, "status": {"y": 2}});
        assert_eq!(spec_part(&a), spec_part(&b));
    }
}
