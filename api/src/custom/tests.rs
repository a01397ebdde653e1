use serde_json::json;

use super::*;

fn crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList", "shortNames": ["wd"]},
            "versions": [
                {
                    "name": "v1", "served": true, "storage": true,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
                        {"name": "Colour", "type": "string", "jsonPath": ".spec.colour", "priority": 1},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
                    ],
                    "schema": {"openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["size"],
                                "properties": {
                                    "size": {"type": "integer", "minimum": 1, "maximum": 10},
                                    "colour": {"type": "string", "enum": ["red", "blue"], "default": "red"},
                                    "name": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 8},
                                    "tags": {"type": "array", "maxItems": 2, "items": {"type": "string"}},
                                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                                    "port": {"x-kubernetes-int-or-string": true},
                                    "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                                    "parts": {"type": "array", "items": {
                                        "type": "object",
                                        "properties": {"id": {"type": "integer"}, "weight": {"type": "number", "default": 1.5}}
                                    }}
                                }
                            },
                            "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}}
                        }
                    }}
                },
                {"name": "v1beta1", "served": true, "storage": false, "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}},
                {"name": "v1alpha1", "served": false, "storage": false, "schema": {"openAPIV3Schema": {"type": "object"}}}
            ]
        }
    })
}

fn v1() -> ResourceInfo {
    resources_of(&crd()).into_iter().find(|r| r.version == "v1").unwrap()
}

#[test]
fn every_served_version_becomes_a_resource_and_the_unserved_one_does_not() {
    let infos = resources_of(&crd());
    let versions: Vec<&str> = infos.iter().map(|r| r.version).collect();
    assert_eq!(versions, ["v1", "v1beta1"]);
    let v1 = &infos[0];
    assert_eq!(
        (v1.kind_id, v1.group, v1.kind, v1.plural, v1.singular),
        (Kind::Custom, "example.com", "Widget", "widgets", "widget")
    );
    assert_eq!(v1.short_names, ["wd"]);
    assert!(v1.namespaced);
    assert_eq!(v1.subresources, ["status"]);
    assert!(infos[1].subresources.is_empty());
    assert_eq!(v1.custom.unwrap().storage_version, "v1");
    assert_eq!(infos[1].custom.unwrap().storage_version, "v1");
    // Custom resources are stored under their group, unlike built-in ones.
    assert_eq!(v1.key(Some("default"), "w"), "/registry/example.com/widgets/default/w");
    assert_eq!(v1.prefix(), "/registry/example.com/widgets/");
}

#[test]
fn unknown_fields_are_pruned_unless_the_schema_preserves_them() {
    let obj = json!({
        "apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "w", "colour": "no"},
        "spec": {
            "size": 2, "shape": "round",
            "labels": {"a": "b"},
            "free": {"anything": {"goes": 1}},
            "parts": [{"id": 1, "extra": true}]
        },
        "extra": 1
    });
    let out = normalize(&v1(), &obj).unwrap();
    assert_eq!(out["metadata"], json!({"name": "w"}));
    assert_eq!(
        out["spec"],
        json!({"size": 2, "labels": {"a": "b"}, "free": {"anything": {"goes": 1}}, "parts": [{"id": 1}]})
    );
    assert!(out.get("extra").is_none());
    let preserving = &resources_of(&crd())[1];
    let kept = normalize(preserving, &obj).unwrap();
    assert_eq!(kept["spec"]["shape"], "round");
    assert_eq!(kept["apiVersion"], "example.com/v1beta1");
}

#[test]
fn defaults_fill_missing_fields_at_every_depth() {
    let info = v1();
    let mut obj = normalize(
        &info,
        &json!({"metadata": {"name": "w"}, "spec": {"size": 2, "parts": [{"id": 1}, {"id": 2, "weight": 3}]}}),
    )
    .unwrap();
    default(&info, &mut obj);
    assert_eq!(obj["spec"]["colour"], "red");
    assert_eq!(obj["spec"]["parts"], json!([{"id": 1, "weight": 1.5}, {"id": 2, "weight": 3}]));
}

#[test]
fn schema_violations_are_reported_with_their_paths() {
    let info = v1();
    let bad = json!({
        "apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
        "spec": {
            "size": 11, "colour": "green", "name": "Bad-Name", "tags": ["a", "b", "c"],
            "labels": {"k": 1}, "port": true, "parts": [{"id": "one"}]
        }
    });
    let errs = validate(&info, &bad, None);
    let by_field = |f: &str| errs.iter().find(|e| e.field == f).unwrap_or_else(|| panic!("no error on {f}: {errs:?}"));
    assert_eq!(errs.len(), 7, "{errs:?}");
    assert!(by_field("spec.size").to_string().contains("spec.size in body should be less than or equal to 10"));
    assert_eq!(by_field("spec.colour").reason(), "FieldValueNotSupported");
    assert!(by_field("spec.name").to_string().contains("should match '^[a-z]+$'"));
    assert!(by_field("spec.tags").to_string().contains("should have at most 2 items"));
    assert!(by_field("spec.labels[k]").to_string().contains("must be of type string: \"integer\""));
    assert!(by_field("spec.port").to_string().contains("must be of type integer-or-string"));
    assert!(by_field("spec.parts[0].id").to_string().contains("must be of type integer: \"string\""));

    let missing = validate(&info, &json!({"metadata": {"name": "w"}, "spec": {"colour": "red"}}), None);
    assert_eq!(missing.len(), 1);
    assert_eq!(missing[0].field, "spec.size");
    assert_eq!(missing[0].reason(), "FieldValueRequired");

    let good =
        json!({"metadata": {"name": "w"}, "spec": {"size": 3, "port": "http", "tags": ["a"], "parts": [{"id": 1}]}});
    assert_eq!(validate(&info, &good, None), vec![]);
}

#[test]
fn printer_columns_follow_their_json_paths() {
    let info = v1();
    let now = DateTime::parse_from_rfc3339("2026-01-01T00:10:00Z").unwrap().with_timezone(&Utc);
    let obj = json!({"metadata": {"name": "w", "creationTimestamp": "2026-01-01T00:00:00Z"}, "spec": {"size": 4}});
    assert_eq!(cells(&info, &obj, now), vec![json!("w"), json!(4), Value::Null, json!("10m")]);
    let names: Vec<&str> = info.custom.unwrap().columns.iter().map(|c| c.name).collect();
    assert_eq!(names, ["Name", "Size", "Colour", "Age"]);
    // Without printer columns: Name and Age.
    let plain = &resources_of(&crd())[1];
    assert_eq!(cells(plain, &obj, now), vec![json!("w"), json!("10m")]);
}

#[test]
fn json_paths_reach_into_lists_and_accept_braces() {
    let obj = json!({"status": {"conditions": [{"type": "A"}, {"type": "B"}]}, "spec": {"m": {"k.x": 1}}});
    assert_eq!(json_path(&obj, ".status.conditions[0].type"), Some(&json!("A")));
    assert_eq!(json_path(&obj, "{.status.conditions[-1].type}"), Some(&json!("B")));
    assert_eq!(json_path(&obj, ".status.conditions[5].type"), None);
    assert_eq!(json_path(&obj, ".spec.missing"), None);
}

#[test]
fn a_valid_definition_passes_and_a_broken_one_says_why() {
    let mut good = crd();
    default_definition(&mut good);
    assert_eq!(validate_definition(&good, None), vec![]);

    let mut bad = crd();
    bad["metadata"]["name"] = json!("gadgets.example.com");
    bad["spec"]["group"] = json!("example");
    bad["spec"]["scope"] = json!("Galaxy");
    bad["spec"]["versions"][0]["storage"] = json!(false);
    bad["spec"]["versions"][1]["schema"]["openAPIV3Schema"]["type"] = json!("string");
    bad["spec"]["versions"][0]["additionalPrinterColumns"][0]["type"] = json!("colour");
    bad["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["name"]["pattern"] =
        json!("([a-z");
    default_definition(&mut bad);
    let errs = validate_definition(&bad, None);
    let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.group",
            "metadata.name",
            "spec.scope",
            "spec.versions",
            "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[name].pattern",
            "spec.versions[0].additionalPrinterColumns[0].type",
            "spec.versions[1].schema.openAPIV3Schema.type",
        ],
        "{errs:?}"
    );

    let mut rescoped = good.clone();
    rescoped["spec"]["scope"] = json!("Cluster");
    assert_eq!(validate_definition(&rescoped, Some(&good))[0].field, "spec.scope");
}

#[test]
fn the_status_accepts_the_names_and_remembers_stored_versions() {
    let mut c = crd();
    c["spec"]["names"].as_object_mut().unwrap().remove("singular");
    let status = status_of(&c, None, "2026-01-01T00:00:00Z");
    assert_eq!(status["acceptedNames"]["singular"], "widget");
    assert_eq!(status["storedVersions"], json!(["v1"]));
    let types: Vec<&Value> = status["conditions"].as_array().unwrap().iter().map(|c| &c["type"]).collect();
    assert_eq!(types, [&json!("NamesAccepted"), &json!("Established")]);

    // Moving storage to v1beta1 keeps v1 in storedVersions, and the
    // conditions keep their transition time.
    c["spec"]["versions"][0]["storage"] = json!(false);
    c["spec"]["versions"][1]["storage"] = json!(true);
    let next = status_of(&c, Some(&status), "2026-02-01T00:00:00Z");
    assert_eq!(next["storedVersions"], json!(["v1", "v1beta1"]));
    assert_eq!(next["conditions"][1]["lastTransitionTime"], "2026-01-01T00:00:00Z");
}

#[test]
fn a_scale_subresource_maps_its_paths_and_bad_paths_are_refused() {
    let mut def = crd();
    def["spec"]["versions"][0]["subresources"]["scale"] = json!({
        "specReplicasPath": ".spec.size", "statusReplicasPath": ".status.count", "labelSelectorPath": ".status.selector"
    });
    let v1 = resources_of(&def).into_iter().find(|r| r.version == "v1").unwrap();
    assert_eq!(v1.subresources, ["status", "scale"]);
    let scale = v1.custom.unwrap().scale.clone().unwrap();
    assert_eq!((scale.spec_replicas.as_str(), scale.status_replicas.as_str()), (".spec.size", ".status.count"));
    assert!(validate_definition(&def, None).is_empty());

    let mut obj = json!({"spec": {"size": 2}});
    assert_eq!(get_path(&obj, ".spec.size"), Some(&json!(2)));
    set_path(&mut obj, ".status.count", json!(3));
    assert_eq!(obj["status"]["count"], 3);
    assert_eq!(get_path(&obj, ".spec.items[0]"), None, "indices are not simple paths");

    def["spec"]["versions"][0]["subresources"]["scale"] = json!({
        "specReplicasPath": ".status.size", "labelSelectorPath": "spec.selector"
    });
    let errs = validate_definition(&def, None);
    let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
    let at = "spec.versions[0].subresources.scale";
    assert!(fields.contains(&format!("{at}.specReplicasPath").as_str()), "{errs:?}");
    assert!(fields.contains(&format!("{at}.statusReplicasPath").as_str()), "{errs:?}");
    assert!(fields.contains(&format!("{at}.labelSelectorPath").as_str()), "{errs:?}");
}
