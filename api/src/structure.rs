//! The shape of objects as strategic merge patches and server-side apply
//! read it: which type each field leads to, how each list merges (on its
//! keys, as a set, or replaced whole) and which maps and structs are
//! atomic.
//!
//! A [`Structure`] is compiled from OpenAPI schemas and their
//! `x-kubernetes-*` markers: the built-in kinds' from
//! [`crate::schemas::builtin`] (the schemas the OpenAPI documents serve), a
//! custom resource's from its CRD version's `openAPIV3Schema`. So the
//! served documents, strategic merge ([`crate::patch`]) and server-side
//! apply ([`crate::managed_fields`]) read one source, and a CRD's list
//! markers count for server-side apply on its objects as Kubernetes counts
//! them.
//!
//! Fields a schema does not describe are [`Ty`]s of no known shape: maps
//! merge key by key, lists are atomic (replaced whole), as for an unknown
//! schema in Kubernetes.

use std::collections::HashMap;
use std::sync::LazyLock;

use serde_json::{json, Map, Value};

use crate::resources::{catalog, Kind, ResourceInfo};
use crate::schemas::{self, REFS};

/// The compiled types of one schema graph: the built-in kinds (one
/// structure, a root per kind) or one custom resource version (its root is
/// the first type).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Structure {
    nodes: Vec<Node>,
}

/// An object type: a struct (`properties`), a map (`additionalProperties`).
#[derive(Debug, Default, PartialEq, Eq)]
struct Node {
    fields: HashMap<String, Def>,
    /// The values of a map.
    values: Option<Def>,
}

/// What a field (or a map's value) is.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Def {
    /// The field's type or, for a list, its elements' type.
    ty: Id,
    list: ListDef,
    strategy: StrategyDef,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Id {
    /// No known shape.
    Any,
    /// `x-kubernetes-map-type: atomic`: owned and replaced as one value.
    Atomic,
    Node(u32),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum ListDef {
    Atomic,
    Set,
    Map(Vec<String>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum StrategyDef {
    Replace,
    MergeScalars,
    MergeByKey(String),
}

const PLAIN: Def = Def { ty: Id::Any, list: ListDef::Atomic, strategy: StrategyDef::Replace };

/// A type within a [`Structure`].
#[derive(Clone, Copy, Debug)]
pub struct Ty<'s> {
    structure: &'s Structure,
    id: Id,
}

impl PartialEq for Ty<'_> {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self.structure, other.structure) && self.id == other.id
    }
}

impl Eq for Ty<'_> {}

/// How a list field merges in server-side apply (`x-kubernetes-list-type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListType<'s> {
    /// Replaced whole (also lists without a marker).
    Atomic,
    /// Elements are identified by their value.
    Set,
    /// Elements are identified by these key fields (`x-kubernetes-list-map-keys`).
    Map(&'s [String]),
}

/// How a list field merges in a strategic merge patch
/// (`x-kubernetes-patch-strategy`, `x-kubernetes-patch-merge-key`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy<'s> {
    /// No strategy: the patch's list replaces the object's.
    Replace,
    /// `merge` on a list of scalars: union.
    MergeScalars,
    /// `merge` on this key.
    MergeByKey(&'s str),
}

/// A field: its type (for a list, its elements'), and how it merges if it
/// is a list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field<'s> {
    pub ty: Ty<'s>,
    pub list: ListType<'s>,
    pub strategy: Strategy<'s>,
}

impl<'s> Ty<'s> {
    /// Owned and replaced as one value.
    pub fn is_atomic(self) -> bool {
        self.id == Id::Atomic
    }

    /// A struct of declared fields (not a free-form map nor unknown): server-side
    /// apply owns its fields, not the struct itself.
    pub fn is_struct(self) -> bool {
        self.node().is_some_and(|n| !n.fields.is_empty())
    }

    fn node(self) -> Option<&'s Node> {
        match self.id {
            Id::Node(i) => self.structure.nodes.get(i as usize),
            Id::Any | Id::Atomic => None,
        }
    }

    /// This type as a field that is not a list.
    pub fn as_field(self) -> Field<'s> {
        Field { ty: self, list: ListType::Atomic, strategy: Strategy::Replace }
    }

    /// The field `name` of this type (a map's value for a map); of no known
    /// shape if the schema does not say.
    pub fn field(self, name: &str) -> Field<'s> {
        let def = self.node().and_then(|n| n.fields.get(name).or(n.values.as_ref())).unwrap_or(&PLAIN);
        Field {
            ty: Ty { structure: self.structure, id: def.ty },
            list: match &def.list {
                ListDef::Atomic => ListType::Atomic,
                ListDef::Set => ListType::Set,
                ListDef::Map(keys) => ListType::Map(keys),
            },
            strategy: match &def.strategy {
                StrategyDef::Replace => Strategy::Replace,
                StrategyDef::MergeScalars => Strategy::MergeScalars,
                StrategyDef::MergeByKey(key) => Strategy::MergeByKey(key),
            },
        }
    }
}

/// The built-in kinds' structure and the root of each.
struct Builtin {
    structure: Structure,
    roots: Vec<(Kind, Id)>,
}

static BUILTIN: LazyLock<Builtin> = LazyLock::new(|| {
    let mut c = Compiler::new(schemas::builtin());
    let roots = catalog()
        .iter()
        .filter_map(|info| Some((info.kind_id, c.named(schemas::name_of(info.group, info.version, info.kind)?))))
        .collect();
    Builtin { structure: Structure { nodes: c.nodes }, roots }
});

/// The top-level type of a built-in kind (of no known shape for
/// [`Kind::Custom`]: use [`of`]).
pub fn of_kind(kind: Kind) -> Ty<'static> {
    let b = &*BUILTIN;
    let id = b.roots.iter().find(|(k, _)| *k == kind).map_or(Id::Any, |(_, id)| *id);
    Ty { structure: &b.structure, id }
}

/// The top-level type of a resource's objects, built-in or custom.
pub fn of(info: &ResourceInfo) -> Ty<'_> {
    match info.custom {
        Some(custom) => custom.structure.root(),
        None => of_kind(info.kind_id),
    }
}

impl From<Kind> for Ty<'static> {
    fn from(kind: Kind) -> Self {
        of_kind(kind)
    }
}

impl Structure {
    /// A custom resource version's structure, from its `openAPIV3Schema`:
    /// the object's `metadata` is always `ObjectMeta`, whatever the schema
    /// says of it (Kubernetes validates and merges it as ObjectMeta too).
    pub fn custom(schema: &Value) -> Structure {
        let mut c = Compiler::new(schemas::builtin());
        c.nodes.push(Node::default());
        let mut root = c.node(schema);
        let meta = c.def(&json!({"$ref": format!("{REFS}io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta")}));
        root.fields.insert("metadata".to_string(), meta);
        c.nodes[0] = root;
        Structure { nodes: c.nodes }
    }

    /// The top-level type of a [`Structure::custom`].
    pub fn root(&self) -> Ty<'_> {
        Ty { structure: self, id: Id::Node(0) }
    }
}

/// Compiles schemas into nodes; each named schema once (schemas may refer
/// to themselves: `JSONSchemaProps`).
struct Compiler<'a> {
    named: &'a Map<String, Value>,
    nodes: Vec<Node>,
    by_name: HashMap<&'a str, Id>,
}

/// The schema a `$ref` names, in either form schemars and Kubernetes write
/// it: `{"$ref": R}` (with siblings) or `{"allOf": [{"$ref": R}]}`.
fn ref_name(schema: &Value) -> Option<&str> {
    let r = schema.get("$ref").or_else(|| match schema.get("allOf")?.as_array()?.as_slice() {
        [only] => only.get("$ref"),
        _ => None,
    })?;
    r.as_str()?.strip_prefix(REFS)
}

fn is_atomic_map(schema: &Value) -> bool {
    schema.get("x-kubernetes-map-type").and_then(Value::as_str) == Some("atomic")
}

fn is_array(schema: &Value) -> bool {
    schema.get("type").and_then(Value::as_str) == Some("array") || schema.get("items").is_some()
}

impl<'a> Compiler<'a> {
    fn new(named: &'a Map<String, Value>) -> Self {
        Compiler { named, nodes: Vec::new(), by_name: HashMap::new() }
    }

    /// The type of the schema `name`.
    fn named(&mut self, name: &str) -> Id {
        let named = self.named;
        let Some((name, schema)) = named.get_key_value(name) else { return Id::Any };
        let name = name.as_str();
        if let Some(id) = self.by_name.get(name) {
            return *id;
        }
        if is_atomic_map(schema) {
            self.by_name.insert(name, Id::Atomic);
            return Id::Atomic;
        }
        if !has_shape(schema) {
            self.by_name.insert(name, Id::Any);
            return Id::Any;
        }
        // Registered before its fields are compiled, for the cycles.
        let id = self.push();
        self.by_name.insert(name, id);
        self.fill(id, schema);
        id
    }

    fn push(&mut self) -> Id {
        self.nodes.push(Node::default());
        Id::Node(u32::try_from(self.nodes.len() - 1).expect("fewer than 2^32 types"))
    }

    fn fill(&mut self, id: Id, schema: &Value) {
        let node = self.node(schema);
        if let Id::Node(i) = id {
            self.nodes[i as usize] = node;
        }
    }

    /// The type of a value with this (inline or `$ref`) schema.
    fn ty(&mut self, schema: &Value) -> Id {
        if is_atomic_map(schema) {
            return Id::Atomic;
        }
        if let Some(name) = ref_name(schema) {
            return self.named(name);
        }
        if !has_shape(schema) {
            return Id::Any;
        }
        let id = self.push();
        self.fill(id, schema);
        id
    }

    fn node(&mut self, schema: &Value) -> Node {
        let fields = match schema.get("properties").and_then(Value::as_object) {
            Some(properties) => properties.iter().map(|(name, s)| (name.clone(), self.def(s))).collect(),
            None => HashMap::new(),
        };
        let values = schema.get("additionalProperties").filter(|s| s.is_object()).map(|s| self.def(s));
        Node { fields, values }
    }

    /// A field's definition from its schema (markers on the field win over
    /// the ones on the schema it refers to).
    fn def(&mut self, schema: &Value) -> Def {
        let named = self.named;
        let target = ref_name(schema).and_then(|n| named.get(n));
        let marker = |key: &str| schema.get(key).or_else(|| target.and_then(|t| t.get(key)));
        let array = is_array(schema) || target.is_some_and(is_array);
        if !array {
            return Def { ty: self.ty(schema), ..PLAIN };
        }
        let items = schema.get("items").or_else(|| target.and_then(|t| t.get("items")));
        let list = match marker("x-kubernetes-list-type").and_then(Value::as_str) {
            Some("set") => ListDef::Set,
            Some("map") => ListDef::Map(
                marker("x-kubernetes-list-map-keys")
                    .and_then(Value::as_array)
                    .map(|keys| keys.iter().filter_map(Value::as_str).map(str::to_string).collect())
                    .unwrap_or_default(),
            ),
            _ => ListDef::Atomic,
        };
        let merges = marker("x-kubernetes-patch-strategy")
            .and_then(Value::as_str)
            .is_some_and(|s| s.split(',').any(|s| s == "merge"));
        let strategy = match marker("x-kubernetes-patch-merge-key").and_then(Value::as_str) {
            _ if !merges => StrategyDef::Replace,
            Some(key) => StrategyDef::MergeByKey(key.to_string()),
            None => StrategyDef::MergeScalars,
        };
        // A list of lists has no element type worth knowing.
        let ty = match items {
            Some(items) if items.is_object() && !is_array(items) => self.ty(items),
            _ => Id::Any,
        };
        Def { ty, list, strategy }
    }
}

/// Whether a schema describes fields or map values (anything else is of no
/// known shape: scalars, free-form objects).
fn has_shape(schema: &Value) -> bool {
    schema.get("properties").is_some_and(Value::is_object)
        || schema.get("additionalProperties").is_some_and(Value::is_object)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve<'s>(root: Ty<'s>, path: &[&str]) -> Field<'s> {
        let mut f = root.as_field();
        for name in path {
            f = f.ty.field(name);
        }
        f
    }

    #[test]
    fn built_in_kinds_read_their_markers_from_the_served_schemas() {
        let pod = of_kind(Kind::Pod);
        let containers = resolve(pod, &["spec", "containers"]);
        assert_eq!(containers.list, ListType::Map(&["name".to_string()]));
        assert_eq!(containers.strategy, Strategy::MergeByKey("name"));
        let ports = containers.ty.field("ports");
        assert_eq!(ports.list, ListType::Map(&["containerPort".to_string(), "protocol".to_string()]));
        assert_eq!(ports.strategy, Strategy::MergeByKey("containerPort"));
        assert_eq!(resolve(pod, &["metadata", "finalizers"]).list, ListType::Set);
        assert_eq!(resolve(pod, &["metadata", "finalizers"]).strategy, Strategy::MergeScalars);
        assert_eq!(resolve(pod, &["spec", "tolerations"]).list, ListType::Atomic);
        // hostIPs merge by ip in a strategic patch but are atomic for apply.
        let host_ips = resolve(pod, &["status", "hostIPs"]);
        assert_eq!((host_ips.list, host_ips.strategy), (ListType::Atomic, Strategy::MergeByKey("ip")));
        assert!(resolve(pod, &["spec", "nodeSelector"]).ty.is_atomic());
        assert!(resolve(pod, &["spec", "containers", "env", "valueFrom", "secretKeyRef"]).ty.is_atomic());
        assert!(resolve(Kind::Deployment.into(), &["spec", "selector"]).ty.is_atomic());
        assert!(resolve(pod, &["metadata", "ownerReferences"]).ty.is_atomic());
        assert!(resolve(pod, &["spec"]).ty.is_struct());
        assert!(!resolve(pod, &["metadata", "labels"]).ty.is_struct());
        assert!(!resolve(pod, &["metadata", "labels"]).ty.is_atomic());
        let conditions = resolve(Kind::PodDisruptionBudget.into(), &["status", "conditions"]);
        assert_eq!(conditions.strategy, Strategy::MergeByKey("type"));
        // Unknown fields: no shape, lists atomic.
        let unknown = resolve(pod, &["spec", "nope", "deeper"]);
        assert_eq!((unknown.list, unknown.strategy), (ListType::Atomic, Strategy::Replace));
        assert!(!unknown.ty.is_struct() && !unknown.ty.is_atomic());
    }

    #[test]
    fn recursive_schemas_compile_once() {
        let crd = of_kind(Kind::CustomResourceDefinition);
        let props = resolve(crd, &["spec", "versions", "schema", "openAPIV3Schema", "properties", "spec"]);
        let deeper = props.ty.field("properties").ty.field("x").ty;
        assert_eq!(props.ty, deeper, "JSONSchemaProps refers to itself");
    }

    #[test]
    fn a_custom_resource_reads_its_crds_markers_and_keeps_object_meta() {
        let schema = json!({
            "type": "object",
            "properties": {
                "spec": {"type": "object", "properties": {
                    "ports": {"type": "array", "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["port", "protocol"],
                        "items": {"type": "object", "properties": {"port": {"type": "integer"}, "protocol": {"type": "string"}}}},
                    "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
                    "selector": {"type": "object", "x-kubernetes-map-type": "atomic",
                        "additionalProperties": {"type": "string"}},
                    "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                }},
                "metadata": {"type": "object"},
            },
        });
        let s = Structure::custom(&schema);
        let root = s.root();
        assert!(root.is_struct());
        let ports = resolve(root, &["spec", "ports"]);
        assert_eq!(ports.list, ListType::Map(&["port".to_string(), "protocol".to_string()]));
        assert!(ports.ty.is_struct());
        assert_eq!(resolve(root, &["spec", "tags"]).list, ListType::Set);
        assert!(resolve(root, &["spec", "selector"]).ty.is_atomic());
        assert!(!resolve(root, &["spec", "free"]).ty.is_struct());
        assert_eq!(resolve(root, &["metadata", "finalizers"]).list, ListType::Set);
        assert!(resolve(root, &["metadata", "ownerReferences"]).ty.is_atomic());
        // A schema that says nothing still knows its metadata.
        let bare = Structure::custom(&json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}));
        assert_eq!(resolve(bare.root(), &["metadata", "finalizers"]).list, ListType::Set);
        assert_eq!(resolve(bare.root(), &["spec", "x"]).list, ListType::Atomic);
    }
}
