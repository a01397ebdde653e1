//! Field paths and sets of fields, in the form Kubernetes writes them in
//! `metadata.managedFields[].fieldsV1` (structured-merge-diff's `FieldsV1`).
//! Pure data; what a set means for an object is [`managed_fields`]'s.
//!
//! A path is a list of elements, each one of:
//!
//! - `f:<name>`: a field of a map (`f:spec`, `f:replicas`);
//! - `k:{"name":"web"}`: the element of a list-map with these key fields
//!   (compact JSON, fields sorted by name);
//! - `v:"x"`: the element of a set-list with this value (compact JSON);
//! - `i:<n>`: the element of a list at index `n`.
//!
//! A set holds paths. In `FieldsV1` it is a tree of JSON objects keyed by
//! path element; a node that is itself in the set and also has children in
//! it carries the key `"."`; a node with no children is `{}` and is always
//! in the set.
//!
//! [`managed_fields`]: crate::managed_fields

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde_json::{Map, Value};

/// Why a `FieldsV1` document could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FieldsError {
    #[error("fieldsV1 at {path:?}: expected a JSON object")]
    NotAnObject { path: String },
    #[error("fieldsV1 at {path:?}: invalid path element {element:?}")]
    InvalidElement { path: String, element: String },
}

/// One step of a path. The derived order (fields, keys, values, indices)
/// is the order Kubernetes sorts elements in.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PathElement {
    /// `f:<name>`.
    Field(String),
    /// `k:<json>`: the key fields of a list-map element, as canonical
    /// compact JSON with the fields sorted by name.
    Key(String),
    /// `v:<json>`: the value of a set-list element, as compact JSON.
    Value(String),
    /// `i:<n>`.
    Index(usize),
}

impl PathElement {
    pub fn field(name: &str) -> PathElement {
        PathElement::Field(name.to_string())
    }

    /// The key element for these key fields (any order).
    pub fn key(fields: &[(&str, &Value)]) -> PathElement {
        let mut sorted: Vec<&(&str, &Value)> = fields.iter().collect();
        sorted.sort_by(|a, b| a.0.cmp(b.0));
        let parts: Vec<String> = sorted
            .iter()
            .map(|(name, value)| format!("{}:{}", Value::String(name.to_string()), canonical(value)))
            .collect();
        PathElement::Key(format!("{{{}}}", parts.join(",")))
    }

    pub fn value(v: &Value) -> PathElement {
        PathElement::Value(canonical(v))
    }

    /// The `FieldsV1` form (`f:spec`).
    pub fn encode(&self) -> String {
        match self {
            PathElement::Field(name) => format!("f:{name}"),
            PathElement::Key(json) => format!("k:{json}"),
            PathElement::Value(json) => format!("v:{json}"),
            PathElement::Index(i) => format!("i:{i}"),
        }
    }

    /// Reads the `FieldsV1` form.
    pub fn decode(s: &str) -> Option<PathElement> {
        let (tag, rest) = s.split_at_checked(2)?;
        match tag {
            "f:" => Some(PathElement::Field(rest.to_string())),
            "k:" => match serde_json::from_str::<Value>(rest).ok()? {
                Value::Object(m) => {
                    let fields: Vec<(&str, &Value)> = m.iter().map(|(k, v)| (k.as_str(), v)).collect();
                    Some(PathElement::key(&fields))
                }
                _ => None,
            },
            "v:" => serde_json::from_str::<Value>(rest).ok().map(|v| PathElement::value(&v)),
            "i:" => rest.parse().ok().map(PathElement::Index),
            _ => None,
        }
    }
}

/// Compact JSON with object fields sorted, whatever serde_json's map order.
fn canonical(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let sorted: BTreeMap<&String, String> = m.iter().map(|(k, v)| (k, canonical(v))).collect();
            let parts: Vec<String> =
                sorted.iter().map(|(k, v)| format!("{}:{v}", Value::String((*k).clone()))).collect();
            format!("{{{}}}", parts.join(","))
        }
        Value::Array(items) => format!("[{}]", items.iter().map(canonical).collect::<Vec<_>>().join(",")),
        other => other.to_string(),
    }
}

/// Kubernetes' printed form of an element, as in conflict messages:
/// `.replicas`, `[name="web"]`, `[="x"]`, `[0]`.
impl fmt::Display for PathElement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathElement::Field(name) => write!(f, ".{name}"),
            PathElement::Key(json) => {
                let fields = match serde_json::from_str::<Value>(json) {
                    Ok(Value::Object(m)) => m,
                    _ => Map::new(),
                };
                let mut parts: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
                parts.sort();
                write!(f, "[{}]", parts.join(","))
            }
            PathElement::Value(json) => write!(f, "[={json}]"),
            PathElement::Index(i) => write!(f, "[{i}]"),
        }
    }
}

/// A path from the root of an object.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Path(pub Vec<PathElement>);

impl Path {
    /// A path of field names only (`Path::fields(&["spec", "replicas"])`).
    pub fn fields(names: &[&str]) -> Path {
        Path(names.iter().map(|n| PathElement::field(n)).collect())
    }

    pub fn child(&self, e: PathElement) -> Path {
        let mut p = self.0.clone();
        p.push(e);
        Path(p)
    }

    pub fn starts_with(&self, prefix: &Path) -> bool {
        self.0.starts_with(&prefix.0)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// `.spec.template.spec.containers[name="web"].image`.
impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for e in &self.0 {
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// A set of paths.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSet(BTreeSet<Path>);

impl FieldSet {
    pub fn new() -> FieldSet {
        FieldSet::default()
    }

    pub fn insert(&mut self, p: Path) {
        self.0.insert(p);
    }

    pub fn remove(&mut self, p: &Path) {
        self.0.remove(p);
    }

    pub fn contains(&self, p: &Path) -> bool {
        self.0.contains(p)
    }

    /// Whether some path of the set lies strictly below `p`.
    pub fn has_descendant(&self, p: &Path) -> bool {
        self.0.range(p.clone()..).take_while(|q| q.starts_with(p)).any(|q| q.len() > p.len())
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Path> {
        self.0.iter()
    }

    pub fn union(&self, other: &FieldSet) -> FieldSet {
        FieldSet(self.0.union(&other.0).cloned().collect())
    }

    pub fn difference(&self, other: &FieldSet) -> FieldSet {
        FieldSet(self.0.difference(&other.0).cloned().collect())
    }

    pub fn intersection(&self, other: &FieldSet) -> FieldSet {
        FieldSet(self.0.intersection(&other.0).cloned().collect())
    }

    /// The paths for which `keep` holds.
    pub fn filter(&self, keep: impl Fn(&Path) -> bool) -> FieldSet {
        FieldSet(self.0.iter().filter(|p| keep(p)).cloned().collect())
    }

    /// The `FieldsV1` JSON of the set.
    pub fn to_fields_v1(&self) -> Value {
        #[derive(Default)]
        struct Node {
            member: bool,
            children: BTreeMap<PathElement, Node>,
        }
        fn json(node: &Node) -> Value {
            let mut m = Map::new();
            if node.member && !node.children.is_empty() {
                m.insert(".".into(), Value::Object(Map::new()));
            }
            for (e, child) in &node.children {
                m.insert(e.encode(), json(child));
            }
            Value::Object(m)
        }
        let mut root = Node::default();
        for p in &self.0 {
            let mut node = &mut root;
            for e in &p.0 {
                node = node.children.entry(e.clone()).or_default();
            }
            node.member = true;
        }
        json(&root)
    }

    /// Reads a `FieldsV1` JSON document.
    pub fn from_fields_v1(v: &Value) -> Result<FieldSet, FieldsError> {
        fn walk(v: &Value, path: &Path, out: &mut FieldSet) -> Result<(), FieldsError> {
            let m = v.as_object().ok_or_else(|| FieldsError::NotAnObject { path: path.to_string() })?;
            if m.is_empty() && !path.is_empty() {
                out.insert(path.clone());
            }
            for (k, child) in m {
                if k == "." {
                    if !path.is_empty() {
                        out.insert(path.clone());
                    }
                    continue;
                }
                let e = PathElement::decode(k)
                    .ok_or_else(|| FieldsError::InvalidElement { path: path.to_string(), element: k.clone() })?;
                walk(child, &path.child(e), out)?;
            }
            Ok(())
        }
        let mut out = FieldSet::new();
        walk(v, &Path::default(), &mut out)?;
        Ok(out)
    }
}

impl FromIterator<Path> for FieldSet {
    fn from_iter<I: IntoIterator<Item = Path>>(iter: I) -> Self {
        FieldSet(iter.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn set(paths: &[&[&str]]) -> FieldSet {
        paths.iter().map(|p| Path::fields(p)).collect()
    }

    #[test]
    fn a_set_round_trips_through_fields_v1_with_dots_for_members_that_have_children() {
        let labels = Path::fields(&["metadata", "labels"]);
        let web = Path::fields(&["spec", "containers"]).child(PathElement::key(&[("name", &json!("web"))]));
        let mut s = FieldSet::new();
        s.insert(labels.clone());
        s.insert(labels.child(PathElement::field("app")));
        s.insert(web.clone());
        s.insert(web.child(PathElement::field("image")));
        s.insert(Path::fields(&["spec", "replicas"]));
        let v = s.to_fields_v1();
        assert_eq!(
            v,
            json!({
                "f:metadata": {"f:labels": {".": {}, "f:app": {}}},
                "f:spec": {"f:containers": {"k:{\"name\":\"web\"}": {".": {}, "f:image": {}}}, "f:replicas": {}}
            })
        );
        assert_eq!(FieldSet::from_fields_v1(&v).unwrap(), s);
    }

    #[test]
    fn keys_are_canonical_whatever_the_order_of_their_fields() {
        let a = PathElement::key(&[("protocol", &json!("TCP")), ("containerPort", &json!(80))]);
        let b = PathElement::decode("k:{\"protocol\":\"TCP\",\"containerPort\":80}").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.encode(), "k:{\"containerPort\":80,\"protocol\":\"TCP\"}");
        assert_eq!(a.to_string(), "[containerPort=80,protocol=\"TCP\"]");
    }

    #[test]
    fn paths_print_as_kubernetes_prints_them_in_conflicts() {
        let p = Path::fields(&["spec", "template", "spec", "containers"])
            .child(PathElement::key(&[("name", &json!("web"))]))
            .child(PathElement::field("image"));
        assert_eq!(p.to_string(), ".spec.template.spec.containers[name=\"web\"].image");
        let v = Path::fields(&["metadata", "finalizers"]).child(PathElement::value(&json!("x")));
        assert_eq!(v.to_string(), ".metadata.finalizers[=\"x\"]");
    }

    #[test]
    fn union_difference_and_intersection_are_set_operations_on_paths() {
        let a = set(&[&["a"], &["b"]]);
        let b = set(&[&["b"], &["c"]]);
        assert_eq!(a.union(&b), set(&[&["a"], &["b"], &["c"]]));
        assert_eq!(a.difference(&b), set(&[&["a"]]));
        assert_eq!(a.intersection(&b), set(&[&["b"]]));
    }

    #[test]
    fn a_descendant_is_found_only_strictly_below_a_path() {
        let s = set(&[&["spec", "replicas"], &["specs"]]);
        assert!(s.has_descendant(&Path::fields(&["spec"])));
        assert!(!s.has_descendant(&Path::fields(&["spec", "replicas"])));
        assert!(!s.has_descendant(&Path::fields(&["status"])));
    }

    #[test]
    fn malformed_fields_v1_is_refused() {
        assert!(FieldSet::from_fields_v1(&json!({"x:spec": {}})).is_err());
        assert!(FieldSet::from_fields_v1(&json!({"f:spec": 1})).is_err());
        assert!(FieldSet::from_fields_v1(&json!({"k:[1]": {}})).is_err());
    }
}
