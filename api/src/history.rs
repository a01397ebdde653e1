//! What changed between two stored versions of one object, for
//! `skiffctl history` (a one-line [`summarize`] per revision) and
//! `skiffctl diff` (a YAML [`unified_diff`]).
//!
//! The summary leaves out the fields every write touches
//! (`metadata.resourceVersion`, `metadata.managedFields`,
//! `metadata.generation`), so a revision that only bumped them reads
//! "no changes". The diff shows both versions whole, as YAML.

use serde_json::Value;
use similar::TextDiff;

/// Fields left out of a summary: the server rewrites them on every write.
const IGNORED: [&str; 3] = ["resourceVersion", "managedFields", "generation"];

/// At most this many changes are listed; the rest are counted.
const MAX_ITEMS: usize = 4;

/// Values longer than this (in characters) are shortened with "…".
const MAX_VALUE: usize = 40;

/// A one-line summary of the change from `old` to `new` (`None`: the object
/// did not exist): `created`, `deleted`, `no changes`, or the changed paths,
/// e.g. `spec.replicas: 1 -> 3; metadata.labels.tier: added`.
pub fn summarize(old: Option<&Value>, new: Option<&Value>) -> String {
    let (old, new) = match (old, new) {
        (None, None) => return "no changes".into(),
        (None, Some(_)) => return "created".into(),
        (Some(_), None) => return "deleted".into(),
        (Some(o), Some(n)) => (without_ignored(o), without_ignored(n)),
    };
    let mut changes = Vec::new();
    match (old.as_object(), new.as_object()) {
        (Some(o), Some(n)) => {
            // Spec (and data) first, then metadata, then status: the order
            // in which a reader cares.
            let rank = |k: &str| match k {
                "metadata" => 1,
                "status" => 2,
                _ => 0,
            };
            let mut keys: Vec<&String> = o.keys().chain(n.keys().filter(|k| !o.contains_key(*k))).collect();
            keys.sort_by(|a, b| rank(a).cmp(&rank(b)).then_with(|| a.cmp(b)));
            for k in keys {
                field_change(k.clone(), o.get(k), n.get(k), &mut changes);
            }
        }
        _ => diff("", &old, &new, &mut changes),
    }
    if changes.is_empty() {
        return "no changes".into();
    }
    let more = changes.len().saturating_sub(MAX_ITEMS);
    changes.truncate(MAX_ITEMS);
    let mut line = changes.join("; ");
    if more > 0 {
        line.push_str(&format!(" (+{more} more)"));
    }
    line
}

fn without_ignored(obj: &Value) -> Value {
    let mut obj = obj.clone();
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        for field in IGNORED {
            m.remove(field);
        }
    }
    obj
}

/// `parent.key`, or `parent["key"]` for keys with dots or slashes (label
/// and annotation keys such as `app.kubernetes.io/name`).
fn child_path(parent: &str, key: &str) -> String {
    let plain = !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    match (parent.is_empty(), plain) {
        (true, true) => key.to_string(),
        (false, true) => format!("{parent}.{key}"),
        (_, false) => format!("{parent}[{}]", Value::from(key)),
    }
}

fn field_change(path: String, old: Option<&Value>, new: Option<&Value>, out: &mut Vec<String>) {
    match (old, new) {
        (Some(o), Some(n)) => diff(&path, o, n, out),
        (None, Some(_)) => out.push(format!("{path}: added")),
        (Some(_), None) => out.push(format!("{path}: removed")),
        (None, None) => {}
    }
}

/// The changed leaves under `path`, objects by key and lists by index.
fn diff(path: &str, old: &Value, new: &Value, out: &mut Vec<String>) {
    if old == new {
        return;
    }
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            let mut keys: Vec<&String> = o.keys().chain(n.keys().filter(|k| !o.contains_key(*k))).collect();
            keys.sort();
            for k in keys {
                field_change(child_path(path, k), o.get(k), n.get(k), out);
            }
        }
        (Value::Array(o), Value::Array(n)) => {
            for i in 0..o.len().max(n.len()) {
                field_change(format!("{path}[{i}]"), o.get(i), n.get(i), out);
            }
        }
        _ => {
            let label = if path.is_empty() { "object" } else { path };
            out.push(format!("{label}: {} -> {}", short(old), short(new)));
        }
    }
}

/// A value for a summary: strings bare, the rest as JSON, long ones cut.
fn short(v: &Value) -> String {
    let text = match v {
        Value::String(s) if !s.is_empty() => s.clone(),
        other => other.to_string(),
    };
    if text.chars().count() > MAX_VALUE {
        let mut cut: String = text.chars().take(MAX_VALUE - 1).collect();
        cut.push('…');
        cut
    } else {
        text
    }
}

/// `v` as YAML, as `kubectl get -o yaml` shows objects.
pub fn to_yaml(v: &Value) -> String {
    // Serializing a JSON value cannot fail; JSON is valid YAML regardless.
    serde_yaml::to_string(v).unwrap_or_else(|_| format!("{v:#}\n"))
}

/// A unified diff (3 lines of context) of the two objects as YAML, with
/// `---`/`+++` headers naming them; empty when the YAML is the same.
pub fn unified_diff(from: &Value, to: &Value, from_label: &str, to_label: &str) -> String {
    let (a, b) = (to_yaml(from), to_yaml(to));
    if a == b {
        return String::new();
    }
    TextDiff::from_lines(&a, &b).unified_diff().context_radius(3).header(from_label, to_label).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployment(replicas: i64, image: &str, rv: &str) -> Value {
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default", "resourceVersion": rv, "generation": 1,
                         "labels": {"app": "web"}},
            "spec": {"replicas": replicas, "template": {"spec": {"containers": [{"name": "nginx", "image": image}]}}},
            "status": {"phase": "Pending"},
        })
    }

    #[test]
    fn a_first_version_is_created_and_a_missing_last_one_deleted() {
        let d = deployment(1, "nginx", "1");
        assert_eq!(summarize(None, Some(&d)), "created");
        assert_eq!(summarize(Some(&d), None), "deleted");
        assert_eq!(summarize(None, None), "no changes");
    }

    #[test]
    fn bookkeeping_fields_alone_are_no_changes() {
        let a = deployment(1, "nginx", "1");
        let mut b = deployment(1, "nginx", "7");
        b["metadata"]["generation"] = json!(2);
        b["metadata"]["managedFields"] = json!([{"manager": "skiffctl"}]);
        assert_eq!(summarize(Some(&a), Some(&b)), "no changes");
    }

    #[test]
    fn changes_list_spec_then_metadata_then_status() {
        let a = deployment(1, "nginx", "1");
        let mut b = deployment(3, "nginx", "2");
        b["metadata"]["labels"]["tier"] = json!("fe");
        b["status"]["phase"] = json!("Running");
        assert_eq!(
            summarize(Some(&a), Some(&b)),
            "spec.replicas: 1 -> 3; metadata.labels.tier: added; status.phase: Pending -> Running"
        );
    }

    #[test]
    fn list_elements_are_named_by_index() {
        let a = deployment(1, "nginx:1.25", "1");
        let b = deployment(1, "nginx:1.26", "2");
        assert_eq!(summarize(Some(&a), Some(&b)), "spec.template.spec.containers[0].image: nginx:1.25 -> nginx:1.26");
        let mut c = b.clone();
        c["spec"]["template"]["spec"]["containers"] =
            json!([{"name": "nginx", "image": "nginx:1.26"}, {"name": "log"}]);
        assert_eq!(summarize(Some(&b), Some(&c)), "spec.template.spec.containers[1]: added");
        assert_eq!(summarize(Some(&c), Some(&b)), "spec.template.spec.containers[1]: removed");
    }

    #[test]
    fn keys_with_dots_are_quoted() {
        let a = json!({"metadata": {"labels": {}}});
        let b = json!({"metadata": {"labels": {"app.kubernetes.io/name": "web"}}});
        assert_eq!(summarize(Some(&a), Some(&b)), r#"metadata.labels["app.kubernetes.io/name"]: added"#);
    }

    #[test]
    fn long_values_are_shortened_and_many_changes_counted() {
        let long = "x".repeat(60);
        let a = json!({"data": {"a": "1", "b": "1", "c": "1", "d": "1", "e": "1", "f": "short"}});
        let b = json!({"data": {"a": "2", "b": "2", "c": "2", "d": "2", "e": "2", "f": long}});
        assert_eq!(
            summarize(Some(&a), Some(&b)),
            "data.a: 1 -> 2; data.b: 1 -> 2; data.c: 1 -> 2; data.d: 1 -> 2 (+2 more)"
        );
        let a = json!({"data": {"f": "short"}});
        let b = json!({"data": {"f": long}});
        let s = summarize(Some(&a), Some(&b));
        assert_eq!(s, format!("data.f: short -> {}…", "x".repeat(39)));
    }

    #[test]
    fn type_changes_and_empty_strings_are_shown_as_json() {
        let a = json!({"spec": {"x": {"y": 1}, "s": ""}});
        let b = json!({"spec": {"x": 5, "s": "v"}});
        assert_eq!(summarize(Some(&a), Some(&b)), r#"spec.s: "" -> v; spec.x: {"y":1} -> 5"#);
    }

    #[test]
    fn non_object_versions_do_not_panic() {
        assert_eq!(summarize(Some(&json!(1)), Some(&json!("a"))), "object: 1 -> a");
        assert_eq!(summarize(Some(&json!([1])), Some(&json!([1, 2]))), "[1]: added");
    }

    #[test]
    fn equal_objects_have_an_empty_diff() {
        let d = deployment(1, "nginx", "1");
        assert_eq!(unified_diff(&d, &d, "a", "b"), "");
    }

    #[test]
    fn diff_is_unified_over_yaml() {
        let a = json!({"kind": "ConfigMap", "data": {"a": "1", "b": "2"}});
        let b = json!({"kind": "ConfigMap", "data": {"a": "1", "b": "3"}});
        let expected =
            "--- rev 1\n+++ rev 2\n@@ -1,4 +1,4 @@\n data:\n   a: '1'\n-  b: '2'\n+  b: '3'\n kind: ConfigMap\n";
        assert_eq!(unified_diff(&a, &b, "rev 1", "rev 2"), expected);
    }

    #[test]
    fn yaml_renders_nested_objects() {
        assert_eq!(to_yaml(&json!({"a": {"b": [1, "x"]}})), "a:\n  b:\n  - 1\n  - x\n");
    }
}
