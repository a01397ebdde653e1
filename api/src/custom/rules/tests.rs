use serde_json::{json, Value};

use super::*;
use crate::custom::{resources_of, validate, validate_definition};
use crate::field::FieldErrorKind;
use crate::resources::ResourceInfo;

/// A CRD whose v1 schema has `rules` at `.spec`, and `root_rules` at the
/// schema's root.
fn crd(rules: Value, root_rules: Value) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "scalers.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "scalers", "singular": "scaler", "kind": "Scaler", "listKind": "ScalerList"},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "x-kubernetes-validations": root_rules,
                    "properties": {
                        "spec": {
                            "type": "object",
                            "x-kubernetes-validations": rules,
                            "properties": {
                                "replicas": {"type": "integer"},
                                "maxReplicas": {"type": "integer"},
                                "ratio": {"type": "number"},
                                "mode": {"type": "string", "x-kubernetes-validations": [
                                    {"rule": "self == oldSelf", "message": "mode is immutable"}
                                ]},
                                "image-name": {"type": "string"},
                                "since": {"type": "string", "format": "date-time"},
                                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                                "ports": {
                                    "type": "array",
                                    "x-kubernetes-list-type": "map",
                                    "x-kubernetes-list-map-keys": ["name"],
                                    "items": {
                                        "type": "object",
                                        "properties": {"name": {"type": "string"}, "port": {"type": "integer"}},
                                        "x-kubernetes-validations": [
                                            {"rule": "self.port >= oldSelf.port", "message": "a port may only grow"}
                                        ]
                                    }
                                }
                            }
                        }
                    }
                }}
            }]
        }
    })
}

fn info(crd: &Value) -> ResourceInfo {
    resources_of(crd).into_iter().next().unwrap()
}

fn scaler(spec: Value) -> Value {
    json!({"apiVersion": "example.com/v1", "kind": "Scaler", "metadata": {"name": "s"}, "spec": spec})
}

fn bodies(errs: &[FieldError]) -> Vec<String> {
    errs.iter().map(|e| format!("{}: {}", e.field, e.body())).collect()
}

#[test]
fn a_rule_that_holds_passes_and_one_that_fails_names_its_field_and_message() {
    let rules =
        json!([{"rule": "self.replicas <= self.maxReplicas", "message": "replicas must not exceed maxReplicas"}]);
    let info = info(&crd(rules, json!([])));
    assert_eq!(validate(&info, &scaler(json!({"replicas": 2, "maxReplicas": 3})), None), vec![]);
    let errs = validate(&info, &scaler(json!({"replicas": 4, "maxReplicas": 3})), None);
    assert_eq!(bodies(&errs), vec![r#"spec: Invalid value: "object": replicas must not exceed maxReplicas"#]);
}

#[test]
fn without_a_message_the_rule_is_the_message_and_a_message_expression_wins() {
    let rules = json!([
        {"rule": "self.replicas > 0"},
        {"rule": "self.replicas < 10", "message": "static", "messageExpression": "'replicas is ' + string(self.replicas)"},
        // A message expression that fails falls back to the message.
        {"rule": "self.replicas != 20", "message": "not twenty", "messageExpression": "self.nosuch"}
    ]);
    let info = info(&crd(rules, json!([])));
    assert_eq!(
        bodies(&validate(&info, &scaler(json!({"replicas": 0})), None)),
        vec![r#"spec: Invalid value: "object": failed rule: self.replicas > 0"#]
    );
    assert_eq!(
        bodies(&validate(&info, &scaler(json!({"replicas": 12})), None)),
        vec![r#"spec: Invalid value: "object": replicas is 12"#]
    );
    assert_eq!(
        bodies(&validate(&info, &scaler(json!({"replicas": 20})), None)),
        vec![r#"spec: Invalid value: "object": replicas is 20"#, r#"spec: Invalid value: "object": not twenty"#]
    );
}

#[test]
fn reason_and_field_path_choose_the_error_kind_and_where_it_is_reported() {
    let rules = json!([
        {"rule": "has(self.maxReplicas)", "reason": "FieldValueRequired", "fieldPath": ".maxReplicas", "message": "set it"},
        {"rule": "!has(self.labels) || !('forbidden' in self.labels)", "reason": "FieldValueForbidden",
         "fieldPath": ".labels['forbidden']", "message": "not this label"}
    ]);
    let info = info(&crd(rules, json!([])));
    let errs = validate(&info, &scaler(json!({"labels": {"forbidden": "x"}})), None);
    assert_eq!(errs[0].kind, FieldErrorKind::Required);
    assert_eq!(errs[1].kind, FieldErrorKind::Forbidden);
    assert_eq!(
        bodies(&errs),
        vec!["spec.maxReplicas: Required value: set it", "spec.labels[forbidden]: Forbidden: not this label"]
    );
}

#[test]
fn values_have_the_types_their_schema_gives_them() {
    let rules = json!([
        {"rule": "type(self.replicas) == int && type(self.ratio) == double"},
        {"rule": "self.since < timestamp('2030-01-01T00:00:00Z')"},
        {"rule": "self.image__dash__name.startsWith('busybox') && self.image__dash__name.lowerAscii() == self.image__dash__name"},
        {"rule": "self.labels.all(k, self.labels[k].size() < 5)"},
        {"rule": "self.ports.map(p, p.port).exists(x, x == 80)"}
    ]);
    let info = info(&crd(rules, json!([])));
    let good = json!({
        "replicas": 1, "ratio": 2, "since": "2026-12-04T10:00:00Z", "image-name": "busybox:1",
        "labels": {"a.b/c": "x"}, "ports": [{"name": "http", "port": 80}]
    });
    assert_eq!(bodies(&validate(&info, &scaler(good), None)), Vec::<String>::new());
    let bad = json!({
        "replicas": 1, "ratio": 2, "since": "2031-01-01T00:00:00Z", "image-name": "BUSYBOX",
        "labels": {"a": "longer"}, "ports": [{"name": "http", "port": 81}]
    });
    assert_eq!(validate(&info, &scaler(bad), None).len(), 4);
}

#[test]
fn a_rule_that_cannot_run_on_the_object_says_why() {
    let info = info(&crd(json!([{"rule": "self.replicas > 1"}]), json!([])));
    assert_eq!(
        bodies(&validate(&info, &scaler(json!({})), None)),
        vec![r#"spec: Invalid value: "object": No such key: replicas evaluating rule: self.replicas > 1"#]
    );
}

#[test]
fn transition_rules_run_on_updates_against_the_correlated_old_value() {
    let info = info(&crd(json!([]), json!([])));
    let old = scaler(json!({"mode": "fast", "ports": [{"name": "a", "port": 80}, {"name": "b", "port": 90}]}));
    // On create there is no old value: the rules do not run.
    assert_eq!(validate(&info, &old, None), vec![]);
    let same = scaler(json!({"mode": "fast", "ports": [{"name": "b", "port": 91}, {"name": "a", "port": 80}]}));
    assert_eq!(validate(&info, &same, Some(&old)), vec![]);
    let changed = scaler(json!({"mode": "slow", "ports": [{"name": "b", "port": 85}, {"name": "c", "port": 1}]}));
    assert_eq!(
        bodies(&validate(&info, &changed, Some(&old))),
        vec![
            r#"spec.mode: Invalid value: "string": mode is immutable"#,
            r#"spec.ports[0]: Invalid value: "object": a port may only grow"#,
        ],
        "item b shrank; item c is new, so its rule does not run"
    );
}

#[test]
fn optional_old_self_runs_on_create_too() {
    let rules = json!([{
        "rule": "oldSelf.hasValue() ? self.replicas >= oldSelf.value().replicas : self.replicas == 1",
        "optionalOldSelf": true,
        "message": "start at one, then only grow"
    }]);
    let info = info(&crd(rules, json!([])));
    assert_eq!(validate(&info, &scaler(json!({"replicas": 1})), None), vec![]);
    assert_eq!(validate(&info, &scaler(json!({"replicas": 2})), None).len(), 1);
    let old = scaler(json!({"replicas": 3}));
    assert_eq!(validate(&info, &scaler(json!({"replicas": 4})), Some(&old)), vec![]);
    assert_eq!(validate(&info, &scaler(json!({"replicas": 2})), Some(&old)).len(), 1);
}

#[test]
fn root_rules_see_the_name_but_not_the_rest_of_the_metadata() {
    let root = json!([
        {"rule": "self.metadata.name.size() <= 5", "message": "short names only"},
        {"rule": "!has(self.metadata.labels)"}
    ]);
    let info = info(&crd(json!([]), root));
    let mut obj = scaler(json!({}));
    obj["metadata"]["labels"] = json!({"a": "b"});
    assert_eq!(validate(&info, &obj, None), vec![]);
    obj["metadata"]["name"] = json!("too-long");
    assert_eq!(bodies(&validate(&info, &obj, None)), vec![r#": Invalid value: "object": short names only"#]);
}

#[test]
fn a_definition_with_rules_that_cannot_run_is_refused_with_the_reasons() {
    let rules = json!([
        {"rule": "self.replicas >"},
        {"rule": "self.replicas > minimum"},
        {"rule": "quantity(self.size).isGreaterThan(quantity('1Gi'))"},
        {"rule": "self.replicas > 0", "reason": "FieldValueBad"},
        {"rule": "self.replicas > 0", "fieldPath": ".nosuch"},
        {"rule": "self.replicas > 0", "optionalOldSelf": true},
        {"rule": "self.replicas > 0", "messageExpression": "'x' +"},
        {"rule": "self.replicas > 0", "message": "two\nlines"},
        {"rule": ""},
        // These are fine: comprehension variables and type names are bound.
        {"rule": "self.ports.all(p, p.port > 0) && type(self.replicas) == int"},
        {"rule": "self.replicas >= oldSelf.replicas", "fieldPath": ".labels['a.b']"}
    ]);
    let errs = validate_definition(&crd(rules, json!([])), None);
    let at = "spec.versions[0].schema.openAPIV3Schema.properties[spec].x-kubernetes-validations";
    let fields: Vec<&str> = errs.iter().map(|e| e.field.strip_prefix(at).unwrap_or(&e.field)).collect();
    assert_eq!(
        fields,
        vec![
            "[0].rule",
            "[1].rule",
            "[2].rule",
            "[3].reason",
            "[4].fieldPath",
            "[5].optionalOldSelf",
            "[6].messageExpression",
            "[7].message",
            "[8].rule"
        ],
        "{errs:#?}"
    );
    assert!(errs[0].detail.starts_with("compilation failed: "), "{}", errs[0].detail);
    assert_eq!(errs[1].detail, "compilation failed: undeclared reference to 'minimum'");
    assert!(errs[2].detail.contains("'quantity'"), "{}", errs[2].detail);
}

#[test]
fn property_names_are_escaped_as_kubernetes_escapes_them() {
    assert_eq!(escape("replicas").as_deref(), Some("replicas"));
    assert_eq!(escape("x-y.z/w").as_deref(), Some("x__dash__y__dot__z__slash__w"));
    assert_eq!(escape("a__b").as_deref(), Some("a__underscores__b"));
    assert_eq!(escape("namespace").as_deref(), Some("__namespace__"));
    assert_eq!(escape("has space"), None);
    assert_eq!(escape("1st"), None);
}
