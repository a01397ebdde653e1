use super::*;
use crate::resources::Kind;

const NOW: &str = "2026-01-01T00:00:00Z";
const LATER: &str = "2026-01-01T00:01:00Z";

fn writer(manager: &str) -> Writer<'_> {
    Writer { manager, api_version: "apps/v1", subresource: "", status_subresource: true, now: NOW }
}

fn deployment(replicas: i64, image: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": image, "ports": [{"containerPort": 80}]}]}
            }
        }
    })
}

fn path(names: &[&str]) -> Path {
    Path::fields(names)
}

fn container(name: &str) -> Path {
    path(&["spec", "template", "spec", "containers"]).child(PathElement::key(&[("name", &json!(name))]))
}

/// A live object as the registry stores it: the applied result with its
/// managers encoded.
fn stored(mut obj: Value, managers: &[Manager]) -> Value {
    encode(managers, &mut obj);
    obj
}

fn must_decode(obj: &Value) -> Vec<Manager> {
    decode(obj).unwrap().unwrap_or_default()
}

#[test]
fn the_field_set_keys_list_maps_defaults_missing_key_fields_and_keeps_atomic_structs_whole() {
    let set = field_set(Kind::Deployment, &deployment(2, "nginx"));
    let port = container("web")
        .child(PathElement::field("ports"))
        .child(PathElement::key(&[("containerPort", &json!(80)), ("protocol", &json!("TCP"))]));
    assert!(set.contains(&path(&["spec", "replicas"])));
    assert!(set.contains(&container("web")), "list-map elements are members");
    assert!(set.contains(&container("web").child(PathElement::field("image"))));
    assert!(set.contains(&port), "ports are keyed by containerPort and protocol, TCP by default");
    assert!(set.contains(&path(&["spec", "selector"])), "a LabelSelector is atomic");
    assert!(!set.contains(&path(&["spec", "selector", "matchLabels", "app"])));
    assert!(!set.contains(&path(&["spec"])), "a struct is not owned, only its fields");
}

#[test]
fn list_markers_come_from_the_served_schema_not_from_the_patch_strategy() {
    // Kubernetes 1.32 marks a Job's conditions and a pod's hostIPs
    // `listType=atomic` (while strategic merge merges them by key) and a
    // budget's conditions `listType=map` on `type`.
    let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
        "status": {"conditions": [{"type": "Complete", "status": "True"}]}});
    let set = field_set(Kind::Job, &job);
    assert!(set.contains(&path(&["status", "conditions"])));
    assert_eq!(set.iter().filter(|p| p.to_string().starts_with(".status.conditions")).count(), 1, "{set:?}");
    let pdb = json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "b"},
        "status": {"conditions": [{"type": "DisruptionAllowed", "status": "True"}]}});
    let allowed = path(&["status", "conditions"]).child(PathElement::key(&[("type", &json!("DisruptionAllowed"))]));
    assert!(field_set(Kind::PodDisruptionBudget, &pdb).contains(&allowed.child(PathElement::field("status"))));
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "status": {"hostIPs": [{"ip": "10.0.0.1"}]}});
    let set = field_set(Kind::Pod, &pod);
    assert!(set.contains(&path(&["status", "hostIPs"])));
    let host_ip = path(&["status", "hostIPs"]).child(PathElement::key(&[("ip", &json!("10.0.0.1"))]));
    assert!(!set.contains(&host_ip));
}

#[test]
fn a_custom_resources_list_markers_come_from_its_crd() {
    let schema = json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
        "routes": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["host"],
            "items": {"type": "object", "properties": {"host": {"type": "string"}, "port": {"type": "integer"}}}},
        "plain": {"type": "array", "items": {"type": "object", "properties": {"host": {"type": "string"}}}},
    }}}});
    let structure = crate::structure::Structure::custom(&schema);
    let obj = json!({"metadata": {"name": "w", "finalizers": ["f"]},
        "spec": {"routes": [{"host": "a", "port": 1}], "plain": [{"host": "a"}]}});
    let set = field_set(structure.root(), &obj);
    let route = path(&["spec", "routes"]).child(PathElement::key(&[("host", &json!("a"))]));
    assert!(set.contains(&route.child(PathElement::field("port"))), "{set:?}");
    assert!(set.contains(&path(&["spec", "plain"])), "unmarked lists are atomic");
    assert!(set.contains(&path(&["metadata", "finalizers"]).child(PathElement::value(&json!("f")))));

    // Two appliers each own their own route; dropping one keeps the other's.
    let w = |name| Writer { api_version: "example.com/v1", ..writer(name) };
    let (obj, managers) = apply(
        structure.root(),
        &Value::Null,
        &json!({"spec": {"routes": [{"host": "a", "port": 1}]}}),
        Vec::new(),
        &w("one"),
        false,
    )
    .unwrap();
    let (obj, managers) = apply(
        structure.root(),
        &obj,
        &json!({"spec": {"routes": [{"host": "b", "port": 2}]}}),
        managers,
        &w("two"),
        false,
    )
    .unwrap();
    assert_eq!(obj["spec"]["routes"], json!([{"host": "a", "port": 1}, {"host": "b", "port": 2}]));
    let (obj, _) = apply(structure.root(), &obj, &json!({"spec": {"routes": []}}), managers, &w("one"), false).unwrap();
    assert_eq!(obj["spec"]["routes"], json!([{"host": "b", "port": 2}]));
}

#[test]
fn sets_and_atomic_lists_are_owned_by_value_and_as_a_whole() {
    let pod = json!({"metadata": {"finalizers": ["a", "b"]}, "spec": {"tolerations": [{"key": "k"}], "containers": [{"name": "c", "args": ["x"]}]}});
    let set = field_set(Kind::Pod, &pod);
    assert!(set.contains(&path(&["metadata", "finalizers"]).child(PathElement::value(&json!("b")))));
    assert!(set.contains(&path(&["spec", "tolerations"])));
    assert!(!set.contains(&path(&["spec", "tolerations"]).child(PathElement::Index(0))));
    let args = Path::fields(&["spec", "containers"])
        .child(PathElement::key(&[("name", &json!("c"))]))
        .child(PathElement::field("args"));
    assert!(set.contains(&args));
}

#[test]
fn merging_combines_list_maps_by_key_and_replaces_atomic_lists() {
    let live = json!({"spec": {
        "tolerations": [{"key": "a"}, {"key": "b"}],
        "containers": [{"name": "app", "image": "v1", "env": [{"name": "A", "value": "1"}]}, {"name": "side", "image": "s"}]
    }});
    let config = json!({"spec": {
        "tolerations": [{"key": "c"}],
        "containers": [{"name": "app", "image": "v2", "env": [{"name": "B", "value": "2"}]}, {"name": "new", "image": "n"}]
    }});
    let merged = merge(Kind::Pod, &live, &config);
    assert_eq!(merged["spec"]["tolerations"], json!([{"key": "c"}]));
    assert_eq!(
        merged["spec"]["containers"],
        json!([
            {"name": "app", "image": "v2", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]},
            {"name": "side", "image": "s"},
            {"name": "new", "image": "n"}
        ])
    );
}

#[test]
fn merging_a_set_list_is_a_union_in_live_order() {
    let merged = merge(
        Kind::ConfigMap,
        &json!({"metadata": {"finalizers": ["a", "b"]}}),
        &json!({"metadata": {"finalizers": ["c", "b"]}}),
    );
    assert_eq!(merged["metadata"]["finalizers"], json!(["a", "c", "b"]));
}

#[test]
fn a_create_records_its_manager_with_the_fields_it_set_and_none_of_the_server_metadata() {
    let mut obj = deployment(2, "nginx");
    obj["metadata"]["uid"] = json!("u1");
    obj["metadata"]["resourceVersion"] = json!("5");
    let managers = update(Kind::Deployment, &Value::Null, &obj, Vec::new(), &writer("kubectl-create"));
    assert_eq!(managers.len(), 1);
    let m = &managers[0];
    assert_eq!((m.name.as_str(), m.operation, m.time.as_deref()), ("kubectl-create", Operation::Update, Some(NOW)));
    assert!(m.fields.contains(&path(&["spec", "replicas"])));
    assert!(m.fields.contains(&path(&["metadata", "labels"])), "an added map is owned with its entries");
    assert!(!m.fields.iter().any(|p| p.starts_with(&path(&["metadata", "uid"]))));
    assert!(!m.fields.iter().any(|p| p.starts_with(&path(&["metadata", "name"]))));
    assert!(!m.fields.iter().any(|p| p.starts_with(&path(&["apiVersion"]))));
}

#[test]
fn an_update_takes_the_fields_it_changes_from_their_previous_managers() {
    let v1 = deployment(2, "nginx");
    let managers = update(Kind::Deployment, &Value::Null, &v1, Vec::new(), &writer("creator"));
    let v2 = deployment(5, "nginx");
    let managers = update(Kind::Deployment, &v1, &v2, managers, &Writer { now: LATER, ..writer("scaler") });
    let creator = managers.iter().find(|m| m.name == "creator").unwrap();
    let scaler = managers.iter().find(|m| m.name == "scaler").unwrap();
    assert!(!creator.fields.contains(&path(&["spec", "replicas"])));
    assert!(creator.fields.contains(&container("web").child(PathElement::field("image"))));
    assert_eq!(scaler.fields, [path(&["spec", "replicas"])].into_iter().collect());
    assert_eq!(creator.time.as_deref(), Some(NOW), "the creator did not write again");
}

#[test]
fn an_update_that_changes_nothing_leaves_the_managers_as_they_were() {
    let v1 = deployment(2, "nginx");
    let managers = update(Kind::Deployment, &Value::Null, &v1, Vec::new(), &writer("creator"));
    let again = update(Kind::Deployment, &v1, &v1, managers.clone(), &Writer { now: LATER, ..writer("creator") });
    assert_eq!(again, managers);
    let other = update(Kind::Deployment, &v1, &v1, managers.clone(), &writer("other"));
    assert_eq!(other, managers, "a manager that changed nothing is not recorded");
}

#[test]
fn a_status_write_owns_only_status_and_a_main_resource_write_owns_no_status() {
    let mut v1 = deployment(2, "nginx");
    v1["status"] = json!({"replicas": 1});
    let main = update(Kind::Deployment, &Value::Null, &v1, Vec::new(), &writer("creator"));
    assert!(!main[0].fields.iter().any(|p| p.starts_with(&path(&["status"]))));
    let mut v2 = v1.clone();
    v2["status"]["replicas"] = json!(2);
    v2["spec"]["replicas"] = json!(3);
    let status = update(Kind::Deployment, &v1, &v2, main, &Writer { subresource: "status", ..writer("controller") });
    let controller = status.iter().find(|m| m.name == "controller").unwrap();
    assert_eq!(controller.subresource, "status");
    assert_eq!(controller.fields, [path(&["status", "replicas"])].into_iter().collect());
}

#[test]
fn applying_to_nothing_creates_the_object_owned_by_the_applier() {
    let config = deployment(2, "nginx");
    let (obj, managers) =
        apply(Kind::Deployment, &Value::Null, &config, Vec::new(), &writer("kubectl"), false).unwrap();
    assert_eq!(obj, config);
    assert_eq!(managers.len(), 1);
    assert_eq!(managers[0].operation, Operation::Apply);
    assert_eq!(
        managers[0].fields,
        config_field_set(Kind::Deployment, &config).unwrap().filter(|p| ownable(&writer("kubectl"), p))
    );
}

#[test]
fn applying_the_same_configuration_again_changes_nothing() {
    let config = deployment(2, "nginx");
    let (obj, managers) =
        apply(Kind::Deployment, &Value::Null, &config, Vec::new(), &writer("kubectl"), false).unwrap();
    let live = stored(obj, &managers);
    let w = Writer { now: LATER, ..writer("kubectl") };
    let (again, again_managers) = apply(Kind::Deployment, &live, &config, must_decode(&live), &w, false).unwrap();
    assert_eq!(stored(again, &again_managers), live, "not even the time moves");
}

#[test]
fn applying_a_different_value_for_a_field_another_applier_owns_is_a_conflict() {
    let (obj, managers) =
        apply(Kind::Deployment, &Value::Null, &deployment(2, "nginx"), Vec::new(), &writer("kubectl"), false).unwrap();
    let live = stored(obj, &managers);
    let err = apply(Kind::Deployment, &live, &deployment(3, "nginx"), must_decode(&live), &writer("other"), false)
        .unwrap_err();
    assert_eq!(err.to_string(), "Apply failed with 1 conflict: conflict with \"kubectl\": .spec.replicas");
    let status = ApiError::from(err).to_status();
    assert_eq!(status["code"], 409);
    assert_eq!(status["reason"], "Conflict");
    assert_eq!(
        status["details"]["causes"],
        json!([{"reason": "FieldManagerConflict", "message": "conflict with \"kubectl\"", "field": ".spec.replicas"}])
    );
}

#[test]
fn applying_the_same_value_shares_ownership_without_conflict() {
    let (obj, managers) =
        apply(Kind::Deployment, &Value::Null, &deployment(2, "nginx"), Vec::new(), &writer("kubectl"), false).unwrap();
    let live = stored(obj, &managers);
    let (_, managers) =
        apply(Kind::Deployment, &live, &deployment(2, "nginx"), must_decode(&live), &writer("other"), false).unwrap();
    let owners = managers.iter().filter(|m| m.fields.contains(&path(&["spec", "replicas"]))).count();
    assert_eq!(owners, 2);
}

#[test]
fn conflicts_with_an_update_manager_name_its_api_version_and_several_are_listed_per_manager() {
    let v1 = deployment(2, "nginx");
    let managers = update(Kind::Deployment, &Value::Null, &v1, Vec::new(), &writer("kubectl-client-side-apply"));
    let live = stored(v1, &managers);
    let err = apply(Kind::Deployment, &live, &deployment(3, "httpd"), must_decode(&live), &writer("kubectl"), false)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "Apply failed with 2 conflicts: conflicts with \"kubectl-client-side-apply\" using apps/v1\n\
         - .spec.replicas\n- .spec.template.spec.containers[name=\"web\"].image"
    );
}

#[test]
fn a_forced_apply_takes_the_conflicting_fields() {
    let (obj, managers) =
        apply(Kind::Deployment, &Value::Null, &deployment(2, "nginx"), Vec::new(), &writer("kubectl"), false).unwrap();
    let live = stored(obj, &managers);
    let config =
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}, "spec": {"replicas": 3}});
    let (obj, managers) = apply(Kind::Deployment, &live, &config, must_decode(&live), &writer("other"), true).unwrap();
    assert_eq!(obj["spec"]["replicas"], 3);
    let kubectl = managers.iter().find(|m| m.name == "kubectl").unwrap();
    let other = managers.iter().find(|m| m.name == "other").unwrap();
    assert!(!kubectl.fields.contains(&path(&["spec", "replicas"])));
    assert_eq!(other.fields, [path(&["spec", "replicas"])].into_iter().collect());
}

#[test]
fn a_field_the_applier_no_longer_applies_is_removed_unless_another_manager_owns_it() {
    let mut config = deployment(2, "nginx");
    config["metadata"]["labels"]["tier"] = json!("front");
    config["metadata"]["annotations"] = json!({"note": "x"});
    let (obj, managers) =
        apply(Kind::Deployment, &Value::Null, &config, Vec::new(), &writer("kubectl"), false).unwrap();
    // Another applier sets the annotation too, and an editor adds one.
    let helm = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "annotations": {"note": "x"}}});
    let (shared, managers) = apply(Kind::Deployment, &obj, &helm, managers, &writer("helm"), false).unwrap();
    let mut touched = shared.clone();
    touched["metadata"]["annotations"]["other"] = json!("y");
    let managers = update(Kind::Deployment, &shared, &touched, managers, &writer("editor"));
    let live = stored(touched, &managers);

    let smaller = deployment(2, "nginx");
    let (obj, _) = apply(Kind::Deployment, &live, &smaller, must_decode(&live), &writer("kubectl"), false).unwrap();
    assert_eq!(obj["metadata"]["labels"], json!({"app": "web"}), "tier was only kubectl's");
    assert_eq!(obj["metadata"]["annotations"], json!({"note": "x", "other": "y"}), "helm's and the editor's stay");

    let (obj, _) = apply(Kind::Deployment, &live, &helm, must_decode(&live), &writer("kubectl"), false).unwrap();
    assert_eq!(
        obj["spec"]["template"]["spec"].get("containers"),
        None,
        "kubectl's containers go when it stops applying them"
    );
}

#[test]
fn a_removed_list_map_element_goes_and_an_emptied_map_goes_with_it() {
    let cm = |data: Value| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": data});
    let w = Writer { api_version: "v1", status_subresource: false, ..writer("kubectl") };
    let (obj, managers) = apply(Kind::ConfigMap, &Value::Null, &cm(json!({"a": "1"})), Vec::new(), &w, false).unwrap();
    let live = stored(obj, &managers);
    let config = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}});
    let (obj, managers) = apply(Kind::ConfigMap, &live, &config, must_decode(&live), &w, false).unwrap();
    assert_eq!(obj.get("data"), None);
    assert!(managers.is_empty(), "kubectl owns nothing any more");

    let mut two = deployment(2, "nginx");
    two["spec"]["template"]["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "side", "image": "busybox"}));
    let (obj, managers) = apply(Kind::Deployment, &Value::Null, &two, Vec::new(), &writer("kubectl"), false).unwrap();
    let live = stored(obj, &managers);
    let (obj, _) =
        apply(Kind::Deployment, &live, &deployment(2, "nginx"), must_decode(&live), &writer("kubectl"), false).unwrap();
    assert_eq!(obj["spec"]["template"]["spec"]["containers"].as_array().unwrap().len(), 1);
}

#[test]
fn an_applied_list_map_element_without_its_key_is_refused() {
    let config = json!({"spec": {"containers": [{"image": "nginx"}]}});
    let err = apply(Kind::Pod, &Value::Null, &config, Vec::new(), &writer("kubectl"), false).unwrap_err();
    assert!(matches!(err, ApplyError::MissingKey { index: 0, .. }), "{err}");
    let twice = json!({"spec": {"containers": [{"name": "a"}, {"name": "a"}]}});
    let err = apply(Kind::Pod, &Value::Null, &twice, Vec::new(), &writer("kubectl"), false).unwrap_err();
    assert!(matches!(err, ApplyError::DuplicateKey { .. }), "{err}");
}

#[test]
fn managers_round_trip_through_managed_fields_in_kubernetes_order() {
    let v1 = deployment(2, "nginx");
    let managers = update(Kind::Deployment, &Value::Null, &v1, Vec::new(), &writer("creator"));
    let (obj, managers) = apply(
        Kind::Deployment,
        &v1,
        &deployment(2, "nginx"),
        managers,
        &Writer { now: LATER, ..writer("kubectl") },
        false,
    )
    .unwrap();
    let live = stored(obj, &managers);
    let entries = live["metadata"]["managedFields"].as_array().unwrap();
    assert_eq!(entries[0]["manager"], "kubectl");
    assert_eq!(entries[0]["operation"], "Apply");
    assert_eq!(entries[1]["operation"], "Update");
    assert_eq!(entries[1]["fieldsType"], "FieldsV1");
    assert_eq!(entries[1]["fieldsV1"]["f:spec"]["f:replicas"], json!({}));
    let mut again = live.clone();
    encode(&must_decode(&live), &mut again);
    assert_eq!(again, live);
}

#[test]
fn malformed_managed_fields_are_refused() {
    assert!(decode(&json!({"metadata": {"managedFields": {}}})).is_err());
    assert!(decode(&json!({"metadata": {"managedFields": [{"operation": "Delete"}]}})).is_err());
    assert!(decode(&json!({"metadata": {"managedFields": [{"fieldsV1": {"bad": {}}}]}})).is_err());
    assert_eq!(decode(&json!({"metadata": {"managedFields": []}})), Ok(None));
}

#[test]
fn past_ten_update_managers_the_oldest_are_merged_into_ancient_changes() {
    let names: Vec<String> = (0..13).map(|i| format!("m{i}")).collect();
    let times: Vec<String> = (0..13).map(|i| format!("2026-01-01T00:00:{i:02}Z")).collect();
    let label = |i: usize| path(&["metadata", "labels", &format!("l{i}")]);
    let mut obj = deployment(1, "nginx");
    let creator = Writer { now: "2025-12-31T00:00:00Z", ..writer("creator") };
    let mut managers = apply(Kind::Deployment, &Value::Null, &obj, Vec::new(), &creator, false).unwrap().1;
    for i in 0..12 {
        let mut next = obj.clone();
        next["metadata"]["labels"][format!("l{i}")] = json!("x");
        let w = Writer { now: &times[i], ..writer(&names[i]) };
        managers = update(Kind::Deployment, &obj, &next, managers, &w);
        obj = next;
    }
    let updaters: Vec<&str> =
        managers.iter().filter(|m| m.operation == Operation::Update).map(|m| m.name.as_str()).collect();
    assert_eq!(updaters.len(), MAX_UPDATE_MANAGERS, "{updaters:?}");
    assert!(managers.iter().any(|m| m.name == "creator" && m.operation == Operation::Apply), "appliers stay");
    let ancient = managers.iter().find(|m| m.name == ANCIENT_CHANGES).expect("a bucket");
    assert_eq!(ancient.fields, [label(0), label(1), label(2)].into_iter().collect());
    assert_eq!((ancient.api_version.as_str(), ancient.time.as_deref()), ("apps/v1", Some(times[2].as_str())));
    assert!(!updaters.contains(&"m2") && updaters.contains(&"m3") && updaters.contains(&"m11"), "{updaters:?}");

    // The next writer pushes one more into the existing bucket.
    let mut next = obj.clone();
    next["metadata"]["labels"]["l12"] = json!("x");
    let w = Writer { now: &times[12], ..writer(&names[12]) };
    let managers = update(Kind::Deployment, &obj, &next, managers, &w);
    let ancient = managers.iter().find(|m| m.name == ANCIENT_CHANGES).unwrap();
    assert_eq!(ancient.fields, (0..4).map(label).collect());
    assert_eq!(managers.iter().filter(|m| m.operation == Operation::Update).count(), MAX_UPDATE_MANAGERS);
    assert!(!managers.iter().any(|m| m.name == "m3"));
}

#[test]
fn a_create_records_what_an_update_from_nothing_records() {
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "p", "namespace": "default", "uid": "u", "resourceVersion": "1",
            "creationTimestamp": "2026-01-01T00:00:00Z", "generateName": "p-",
            "labels": {"app": "web", "tier": "front"}, "annotations": {},
            "finalizers": ["a", "b", "a"],
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "r1", "controller": true}]
        },
        "spec": {
            "containers": [
                {"name": "web", "image": "nginx", "ports": [{"containerPort": 80}, {"containerPort": 53, "protocol": "UDP"}],
                 "resources": {"requests": {"cpu": "100m", "memory": "500Mi"}}, "env": [{"name": "A", "value": "1"}],
                 "command": ["sh", "-c", "sleep 1"]},
                {"image": "no-name"}
            ],
            "nodeSelector": {"zone": "a"},
            "tolerations": [{"key": "k", "operator": "Exists"}],
            "affinity": {},
            "schedulerName": "default-scheduler", "priority": 0
        },
        "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False"}]}
    });
    let service = json!({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
        "spec": {"ports": [{"port": 80, "targetPort": 8080}, {"port": 53, "protocol": "UDP"}], "selector": {"app": "web"},
                 "clusterIPs": ["10.0.0.1"], "type": "ClusterIP"}
    });
    let custom = json!({"apiVersion": "example.com/v1", "kind": "Thing", "metadata": {"name": "t"},
                        "spec": {"list": [1, 2], "nested": {"a": {}}}, "status": {"ok": true}});
    let empty_meta = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {}, "data": {"k": "v"}});
    let only_server_meta = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {}});
    let nothing_owned = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "uid": "u"}});
    let cases = [
        (Kind::Pod, pod),
        (Kind::Deployment, deployment(3, "nginx")),
        (Kind::Service, service),
        (Kind::Custom, custom),
        (Kind::ConfigMap, empty_meta),
        (Kind::ConfigMap, only_server_meta),
        (Kind::ConfigMap, nothing_owned),
    ];
    let writers = [
        writer("creator"),
        Writer { status_subresource: false, ..writer("creator") },
        Writer { subresource: "status", ..writer("creator") },
    ];
    for (kind, obj) in cases {
        for w in &writers {
            let mut fast = obj.clone();
            record_create(kind, &mut fast, w);
            let mut slow = obj.clone();
            encode(&update(kind, &Value::Null, &obj, Vec::new(), w), &mut slow);
            assert_eq!(fast, slow, "{kind:?} written by {w:?}");
        }
    }
}

/// `update_stored` gives what decoding every stored manager, `update` and
/// `encode` give.
fn assert_stored_update_as_update(kind: Kind, live: &Value, new: &Value, w: &Writer) {
    let mut lazy = new.clone();
    update_stored(kind, live, &mut lazy, w);
    let mut general = new.clone();
    let managers = decode(live).ok().flatten().unwrap_or_default();
    encode(&update(kind, live, new, managers, w), &mut general);
    assert_eq!(lazy, general, "{} by {w:?}", serde_json::to_string_pretty(new).unwrap());
}

#[test]
fn an_update_of_stored_managers_records_what_decoding_them_all_records() {
    let created = {
        let mut d = deployment(3, "nginx");
        record_create(Kind::Deployment, &mut d, &writer("creator"));
        d
    };
    let status_writer = Writer { subresource: "status", now: LATER, ..writer("controller") };
    let mut with_status = created.clone();
    with_status["status"] = json!({"replicas": 3, "conditions": [{"type": "Available", "status": "True"}]});
    // A first status write: the creator's spec fields are left alone.
    assert_stored_update_as_update(Kind::Deployment, &created, &with_status, &status_writer);
    let mut live = with_status.clone();
    update_stored(Kind::Deployment, &created, &mut live, &status_writer);
    assert_eq!(must_decode(&live).len(), 2);

    // The same manager again, changing and removing status fields.
    let mut next = live.clone();
    next["status"] = json!({"replicas": 2});
    assert_stored_update_as_update(Kind::Deployment, &live, &next, &status_writer);
    // Another manager takes a spec field from the creator; one removes one.
    let mut scaled = live.clone();
    scaled["spec"]["replicas"] = json!(5);
    assert_stored_update_as_update(Kind::Deployment, &live, &scaled, &Writer { now: LATER, ..writer("scaler") });
    let mut unlabelled = live.clone();
    unlabelled["metadata"]["labels"] = json!({});
    assert_stored_update_as_update(Kind::Deployment, &live, &unlabelled, &Writer { now: LATER, ..writer("editor") });
    // The creator writes again; nothing changes; no managers stored.
    assert_stored_update_as_update(Kind::Deployment, &live, &scaled, &writer("creator"));
    assert_stored_update_as_update(Kind::Deployment, &live, &live, &writer("creator"));
    let mut bare = live.clone();
    bare["metadata"].as_object_mut().unwrap().remove("managedFields");
    assert_stored_update_as_update(Kind::Deployment, &bare, &scaled, &writer("scaler"));
    // Unreadable bookkeeping is dropped either way.
    let mut unreadable = live.clone();
    unreadable["metadata"]["managedFields"][0]["operation"] = json!("Sideways");
    assert_stored_update_as_update(Kind::Deployment, &unreadable, &scaled, &writer("scaler"));
    let mut bad_fields = live.clone();
    bad_fields["metadata"]["managedFields"][1]["fieldsV1"] = json!({"x:nope": {}});
    assert_stored_update_as_update(Kind::Deployment, &bad_fields, &scaled, &writer("scaler"));
}

#[test]
fn an_update_of_stored_managers_past_ten_merges_the_oldest_as_update_does() {
    let mut live = deployment(1, "nginx");
    record_create(Kind::Deployment, &mut live, &Writer { now: "2025-01-01T00:00:00Z", ..writer("creator") });
    let times: Vec<String> = (0..12).map(|i| format!("2025-02-{:02}T00:00:00Z", i + 1)).collect();
    for (i, time) in times.iter().enumerate() {
        let mut next = live.clone();
        next["metadata"]["annotations"][format!("a{i}")] = json!("x");
        let name = format!("m{i}");
        let w = Writer { now: time, ..writer(&name) };
        assert_stored_update_as_update(Kind::Deployment, &live, &next, &w);
        update_stored(Kind::Deployment, &live, &mut next, &w);
        live = next;
    }
    assert!(must_decode(&live).iter().any(|m| m.name == ANCIENT_CHANGES));
}
