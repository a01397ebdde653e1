//! Tests of normalization and validation, on realistic objects run through
//! the registry's order: normalize, default, validate.

use proptest::prelude::*;
use serde_json::{json, Value};

use super::*;
use crate::defaults;
use crate::field::FieldErrorKind;
use crate::resources::{of, Kind};

/// Normalizes and defaults `obj` as the registry does before validating.
fn prepare(kind: Kind, obj: Value) -> Value {
    let info = of(kind);
    let mut v = normalize(info, &obj).unwrap_or_else(|e| panic!("normalize failed: {e}"));
    defaults::apply(info, &mut v);
    v
}

fn errors(kind: Kind, obj: Value) -> Vec<FieldError> {
    validate(of(kind), &prepare(kind, obj), None)
}

fn update_errors(kind: Kind, old: Value, new: Value) -> Vec<FieldError> {
    let old = prepare(kind, old);
    validate(of(kind), &prepare(kind, new), Some(&old))
}

/// The one error at `field`, failing with the full list otherwise.
fn error_at<'a>(errs: &'a [FieldError], field: &str) -> &'a FieldError {
    let at: Vec<&FieldError> = errs.iter().filter(|e| e.field == field).collect();
    match at.as_slice() {
        [one] => one,
        _ => panic!("expected one error at {field}, got {errs:#?}"),
    }
}

fn messages(errs: &[FieldError]) -> Vec<String> {
    errs.iter().map(ToString::to_string).collect()
}

fn assert_valid(kind: Kind, obj: Value) {
    let errs = errors(kind, obj);
    assert!(errs.is_empty(), "unexpected errors: {:#?}", messages(&errs));
}

fn pod() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web-1", "namespace": "default", "labels": {"app": "web"}},
        "spec": {
            "containers": [{
                "name": "nginx",
                "image": "nginx:1.25",
                "ports": [{"containerPort": 80, "name": "http"}],
                "env": [{"name": "MODE", "value": "prod"}],
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "500m", "memory": "128Mi"}},
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"}}
            }],
            "volumes": [{"name": "data", "emptyDir": {}}]
        }
    })
}

fn pod_template() -> Value {
    json!({
        "metadata": {"labels": {"app": "web"}},
        "spec": {"containers": [{"name": "nginx", "image": "nginx:1.25", "ports": [{"containerPort": 80}]}]}
    })
}

fn deployment() -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}}, "template": pod_template()}
    })
}

fn replication_controller() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ReplicationController",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"replicas": 3, "selector": {"app": "web"}, "template": pod_template()}
    })
}

fn service() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": "http"}]}
    })
}

fn job() -> Value {
    let mut template = pod_template();
    template["spec"]["restartPolicy"] = json!("Never");
    json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "migrate", "namespace": "default"},
        "spec": {"template": template}
    })
}

fn cron_job() -> Value {
    let mut template = pod_template();
    template["spec"]["restartPolicy"] = json!("OnFailure");
    json!({
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "nightly", "namespace": "default"},
        "spec": {"schedule": "0 3 * * *", "jobTemplate": {"spec": {"template": template}}}
    })
}

/// One realistic, valid object of every kind.
fn samples() -> Vec<(Kind, Value)> {
    let mut ds = deployment();
    ds["kind"] = json!("DaemonSet");
    if let Some(spec) = ds["spec"].as_object_mut() {
        spec.remove("replicas");
    }
    let mut rs = deployment();
    rs["kind"] = json!("ReplicaSet");
    vec![
        (Kind::Pod, pod()),
        (Kind::Service, service()),
        (Kind::Deployment, deployment()),
        (Kind::ReplicaSet, rs),
        (Kind::ReplicationController, replication_controller()),
        (Kind::DaemonSet, ds),
        (Kind::Job, job()),
        (Kind::CronJob, cron_job()),
        (Kind::Namespace, json!({"metadata": {"name": "team-a"}})),
        (
            Kind::Node,
            json!({"metadata": {"name": "node-1.example.com"}, "spec": {"taints": [{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]},
                   "status": {"capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"}}}),
        ),
        (
            Kind::Endpoints,
            json!({"metadata": {"name": "web", "namespace": "default"},
                   "subsets": [{"addresses": [{"ip": "10.0.0.5"}], "ports": [{"port": 80}]}]}),
        ),
        (
            Kind::EndpointSlice,
            json!({"metadata": {"name": "web-abc12", "namespace": "default"}, "addressType": "IPv4",
                   "endpoints": [{"addresses": ["10.0.0.5"], "conditions": {"ready": true}, "nodeName": "node-1"}],
                   "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}),
        ),
        (Kind::ConfigMap, json!({"metadata": {"name": "cfg", "namespace": "default"}, "data": {"app.conf": "x=1"}})),
        (
            Kind::Secret,
            json!({"metadata": {"name": "creds", "namespace": "default"}, "stringData": {"password": "hunter2"}}),
        ),
        (Kind::ServiceAccount, json!({"metadata": {"name": "builder", "namespace": "default"}})),
        (
            Kind::Event,
            json!({"metadata": {"name": "web-1.17a8c3f2b1c4d5e6", "namespace": "default"},
                   "involvedObject": {"kind": "Pod", "name": "web-1", "namespace": "default"},
                   "reason": "Scheduled", "message": "assigned", "type": "Normal", "count": 1}),
        ),
        (
            Kind::Lease,
            json!({"metadata": {"name": "node-1", "namespace": "kube-node-lease"},
                   "spec": {"holderIdentity": "node-1", "leaseDurationSeconds": 40, "renewTime": "2024-01-02T03:04:05.123456Z"}}),
        ),
        (
            Kind::ResourceQuota,
            json!({"metadata": {"name": "quota", "namespace": "default"}, "spec": {"hard": {"pods": "10", "requests.cpu": 4}}}),
        ),
        (
            Kind::LimitRange,
            json!({"metadata": {"name": "limits", "namespace": "default"},
                   "spec": {"limits": [{"type": "Container", "max": {"cpu": "2"}, "min": {"cpu": "100m"}}]}}),
        ),
        (Kind::PriorityClass, json!({"metadata": {"name": "high"}, "value": 1000, "description": "batch"})),
        (
            Kind::PodDisruptionBudget,
            json!({"metadata": {"name": "web", "namespace": "default"},
                   "spec": {"minAvailable": "50%", "selector": {"matchLabels": {"app": "web"}},
                            "unhealthyPodEvictionPolicy": "AlwaysAllow"}}),
        ),
        (Kind::PriorityClass, json!({"metadata": {"name": "system-node-critical"}, "value": 2000001000})),
        (
            Kind::ClusterRole,
            json!({"metadata": {"name": "system:node-reader"},
                   "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
                             {"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]}),
        ),
        (
            Kind::RoleBinding,
            json!({"metadata": {"name": "viewers", "namespace": "default"},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
                   "subjects": [{"kind": "User", "name": "vera"}, {"kind": "ServiceAccount", "name": "robot"}]}),
        ),
    ]
}

// ---- names

#[test]
fn name_checks_explain_themselves_in_kubernetes_words() {
    assert!(is_dns1123_label("web-1").is_empty());
    assert_eq!(
        is_dns1123_label("Web_1"),
        vec!["a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name' or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"]
    );
    assert_eq!(is_dns1123_label("a.b"), vec!["must not contain dots"]);
    assert_eq!(is_dns1123_label(&"a".repeat(64)), vec!["must be no more than 63 characters"]);
    assert!(is_dns1123_subdomain("node-1.example.com").is_empty());
    assert_eq!(
        is_dns1123_subdomain("Example.com"),
        vec!["a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"]
    );
    assert!(is_dns1123_subdomain("a..b").len() == 1 && is_dns1123_subdomain("").len() == 1);
    assert!(is_dns1035_label("web").is_empty());
    assert_eq!(
        is_dns1035_label("1web"),
        vec!["a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name' or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"]
    );
}

#[test]
fn qualified_names_may_have_a_subdomain_prefix() {
    assert!(is_qualified_name("app").is_empty());
    assert!(is_qualified_name("app.kubernetes.io/name").is_empty());
    assert!(is_qualified_name("My_Name.1").is_empty());
    assert_eq!(is_qualified_name("/name"), vec!["prefix part must be non-empty"]);
    assert_eq!(is_qualified_name("example.com/"), vec![
        "name part must be non-empty",
        "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName' or 'my.name' or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
    ]);
    assert!(is_qualified_name("a/b/c")[0].starts_with("a qualified name must consist of"));
    assert!(is_qualified_name("Example.com/x")[0].starts_with("prefix part a lowercase RFC 1123 subdomain"));
    assert_eq!(is_qualified_name(&"a".repeat(64)), vec!["name part must be no more than 63 characters"]);
}

#[test]
fn label_values_may_be_empty_but_not_malformed() {
    assert!(is_label_value("").is_empty());
    assert!(is_label_value("v1.2_beta-3").is_empty());
    assert!(is_label_value("-x")[0].starts_with("a valid label must be an empty string or consist of"));
    assert_eq!(is_label_value(&"a".repeat(64)), vec!["must be no more than 63 characters"]);
    assert!(is_config_map_key("app.conf").is_empty());
    assert_eq!(is_config_map_key(".."), vec!["must not be '..'"]);
    assert!(is_port_name("http").is_empty());
    assert_eq!(is_port_name("80"), vec!["must contain at least one letter (a-z)"]);
}

// ---- normalize

#[test]
fn a_string_where_containers_belong_is_a_type_error_at_that_path() {
    let mut p = pod();
    p["spec"]["containers"] = json!("nginx");
    let e = normalize(of(Kind::Pod), &p).unwrap_err();
    assert_eq!(e.field, "spec.containers");
    assert_eq!(e.kind, FieldErrorKind::TypeInvalid);
    assert!(e.detail.contains("invalid type: string \"nginx\""), "{}", e.detail);
}

#[test]
fn a_wrong_shape_deep_inside_is_reported_with_a_kubernetes_path() {
    let mut p = pod();
    p["spec"]["containers"][0]["ports"][0]["containerPort"] = json!("eighty");
    let e = normalize(of(Kind::Pod), &p).unwrap_err();
    assert_eq!(e.field, "spec.containers[0].ports[0].containerPort");
    assert_eq!(e.reason(), "FieldValueTypeInvalid");

    let mut d = deployment();
    d["spec"]["replicas"] = json!("three");
    let e = normalize(of(Kind::Deployment), &d).unwrap_err();
    assert_eq!(e.field, "spec.replicas");
    assert!(e.to_string().starts_with("spec.replicas: Invalid value: invalid type: string \"three\""), "{e}");

    let e = normalize(of(Kind::Pod), &json!(["not", "an", "object"])).unwrap_err();
    assert_eq!(e.kind, FieldErrorKind::TypeInvalid);
}

#[test]
fn normalizing_drops_unknown_fields_and_sets_the_catalog_type() {
    let mut p = pod();
    p["spec"]["containers"][0]["colour"] = json!("blue");
    p["surprise"] = json!(1);
    p["apiVersion"] = json!("v2");
    p["kind"] = json!("Pdo");
    let n = normalize(of(Kind::Pod), &p).unwrap();
    assert_eq!(n["apiVersion"], "v1");
    assert_eq!(n["kind"], "Pod");
    assert!(n.get("surprise").is_none());
    assert!(n["spec"]["containers"][0].get("colour").is_none());
    assert_eq!(n["spec"]["containers"][0]["image"], "nginx:1.25");
    let d = normalize(of(Kind::Deployment), &deployment()).unwrap();
    assert_eq!(d["apiVersion"], "apps/v1");
}

#[test]
fn numbers_are_accepted_where_quantities_belong() {
    let mut p = pod();
    p["spec"]["containers"][0]["resources"] = json!({"limits": {"cpu": 1, "memory": 1e9}, "requests": {"cpu": 0.5}});
    let n = normalize(of(Kind::Pod), &p).unwrap();
    assert_eq!(n["spec"]["containers"][0]["resources"]["limits"]["cpu"], "1");
    assert_eq!(n["spec"]["containers"][0]["resources"]["requests"]["cpu"], "0.5");
    // Elsewhere a number is still the wrong shape.
    let mut p = pod();
    p["spec"]["containers"][0]["env"][0]["value"] = json!(5);
    assert_eq!(normalize(of(Kind::Pod), &p).unwrap_err().field, "spec.containers[0].env[0].value");
}

#[test]
fn a_secrets_string_data_is_merged_into_its_data() {
    let s = json!({"metadata": {"name": "s", "namespace": "default"}, "data": {"user": "YWRtaW4="}, "stringData": {"password": "hunter2"}});
    let n = normalize(of(Kind::Secret), &s).unwrap();
    assert_eq!(n["data"], json!({"user": "YWRtaW4=", "password": "aHVudGVyMg=="}));
    assert!(n.get("stringData").is_none());
    let bad = json!({"metadata": {"name": "s"}, "data": {"k": "not base64!"}});
    assert_eq!(normalize(of(Kind::Secret), &bad).unwrap_err().field, "data.k");
}

#[test]
fn every_sample_object_is_valid_and_stable_under_normalization() {
    for (kind, obj) in samples() {
        let info = of(kind);
        let prepared = prepare(kind, obj);
        let errs = validate(info, &prepared, None);
        assert!(errs.is_empty(), "{kind:?}: {:#?}", messages(&errs));
        assert_eq!(normalize(info, &prepared).unwrap(), prepared, "{kind:?} changes when normalized again");
        let errs = validate(info, &prepared, Some(&prepared));
        assert!(errs.is_empty(), "{kind:?} as an unchanged update: {:#?}", messages(&errs));
    }
}

// ---- metadata

#[test]
fn an_object_without_a_name_is_invalid() {
    let mut p = pod();
    p["metadata"]["name"] = json!("");
    let errs = errors(Kind::Pod, p);
    assert_eq!(
        error_at(&errs, "metadata.name").to_string(),
        "metadata.name: Required value: name or generateName is required"
    );
}

#[test]
fn names_follow_the_format_of_their_kind() {
    let mut p = pod();
    p["metadata"]["name"] = json!("Web_1");
    let e = error_at(&errors(Kind::Pod, p), "metadata.name").clone();
    assert!(
        e.to_string().starts_with("metadata.name: Invalid value: \"Web_1\": a lowercase RFC 1123 subdomain"),
        "{e}"
    );

    let mut s = service();
    s["metadata"]["name"] = json!("1web");
    let errs = errors(Kind::Service, s);
    assert!(error_at(&errs, "metadata.name").detail.starts_with("a DNS-1035 label"));

    let errs = errors(Kind::Namespace, json!({"metadata": {"name": "team.a"}}));
    assert_eq!(error_at(&errs, "metadata.name").detail, "must not contain dots");

    assert_valid(Kind::Node, json!({"metadata": {"name": "ip-10-0-0-1.ec2.internal"}}));
    let mut d = deployment();
    d["metadata"]["generateName"] = json!("web-");
    assert_valid(Kind::Deployment, d);
}

#[test]
fn namespaces_are_required_for_namespaced_kinds_and_forbidden_for_the_others() {
    let mut p = pod();
    p["metadata"].as_object_mut().unwrap().remove("namespace");
    let errs = errors(Kind::Pod, p);
    assert_eq!(error_at(&errs, "metadata.namespace").to_string(), "metadata.namespace: Required value");

    let mut p = pod();
    p["metadata"]["namespace"] = json!("Team_A");
    assert!(error_at(&errors(Kind::Pod, p), "metadata.namespace").detail.starts_with("a lowercase RFC 1123 label"));

    let errs = errors(Kind::Node, json!({"metadata": {"name": "n1", "namespace": "default"}}));
    assert_eq!(
        error_at(&errs, "metadata.namespace").to_string(),
        "metadata.namespace: Forbidden: not allowed on this type"
    );
}

#[test]
fn label_keys_and_values_are_checked_at_metadata_labels() {
    let mut p = pod();
    p["metadata"]["labels"] = json!({"app.kubernetes.io/name": "web", "bad key": "ok", "tier": "front end"});
    let errs = errors(Kind::Pod, p);
    let at: Vec<&FieldError> = errs.iter().filter(|e| e.field == "metadata.labels").collect();
    assert_eq!(at.len(), 2, "{errs:#?}");
    assert!(at.iter().any(|e| e.kind == FieldErrorKind::Invalid("\"bad key\"".into())
        && e.detail.starts_with("name part must consist of alphanumeric characters")));
    assert!(at.iter().any(|e| e.kind == FieldErrorKind::Invalid("\"front end\"".into())
        && e.detail.starts_with("a valid label must be an empty string")));
}

#[test]
fn annotations_have_qualified_keys_and_at_most_256_kib() {
    let mut p = pod();
    p["metadata"]["annotations"] =
        json!({"Example.com/Note": "keys may use capitals", "kubectl.kubernetes.io/last-applied-configuration": "{}"});
    assert_valid(Kind::Pod, p);

    let mut p = pod();
    p["metadata"]["annotations"] = json!({"big": "x".repeat(256 * 1024)});
    let errs = errors(Kind::Pod, p);
    assert_eq!(
        error_at(&errs, "metadata.annotations").to_string(),
        "metadata.annotations: Too long: may not be more than 262144 bytes"
    );

    let mut p = pod();
    p["metadata"]["annotations"] = json!({"a b": "c"});
    assert_eq!(error_at(&errors(Kind::Pod, p), "metadata.annotations").reason(), "FieldValueInvalid");
}

#[test]
fn finalizers_are_standard_or_fully_qualified() {
    let mut p = pod();
    p["metadata"]["finalizers"] = json!(["example.com/cleanup", "foregroundDeletion"]);
    assert_valid(Kind::Pod, p);
    let mut p = pod();
    p["metadata"]["finalizers"] = json!(["cleanup"]);
    let errs = errors(Kind::Pod, p);
    assert_eq!(
        error_at(&errs, "metadata.finalizers").to_string(),
        "metadata.finalizers: Invalid value: \"cleanup\": name is neither a standard finalizer name nor is it fully qualified"
    );
}

#[test]
fn owner_references_need_api_version_kind_name_and_uid() {
    let mut p = pod();
    p["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-abc", "uid": ""}]);
    let errs = errors(Kind::Pod, p);
    assert_eq!(
        error_at(&errs, "metadata.ownerReferences.uid").to_string(),
        "metadata.ownerReferences.uid: Invalid value: \"\": uid must not be empty"
    );

    let mut p = pod();
    let owner = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "a", "uid": "1", "controller": true});
    let mut other = owner.clone();
    other["name"] = json!("b");
    p["metadata"]["ownerReferences"] = json!([owner, other]);
    let errs = errors(Kind::Pod, p);
    assert!(error_at(&errs, "metadata.ownerReferences")
        .detail
        .starts_with("Only one reference can have Controller set to true"));
}

#[test]
fn name_namespace_uid_and_creation_time_are_immutable() {
    let mut old = pod();
    old["metadata"]["uid"] = json!("0f3c");
    old["metadata"]["creationTimestamp"] = json!("2024-01-02T03:04:05Z");
    let mut new = old.clone();
    new["metadata"]["uid"] = json!("9999");
    new["metadata"]["name"] = json!("web-2");
    let errs = update_errors(Kind::Pod, old.clone(), new);
    assert_eq!(
        error_at(&errs, "metadata.uid").to_string(),
        "metadata.uid: Invalid value: \"9999\": field is immutable"
    );
    assert_eq!(error_at(&errs, "metadata.name").detail, "field is immutable");

    // Left out, they are filled in from the stored object: not a change.
    let mut new = old.clone();
    new["metadata"].as_object_mut().unwrap().remove("uid");
    new["metadata"]["labels"]["version"] = json!("2");
    assert!(update_errors(Kind::Pod, old, new).is_empty());
}

// ---- pods

#[test]
fn a_pod_without_containers_is_invalid() {
    let mut p = pod();
    p["spec"]["containers"] = json!([]);
    let errs = errors(Kind::Pod, p);
    assert_eq!(error_at(&errs, "spec.containers").to_string(), "spec.containers: Required value");
}

#[test]
fn container_names_are_dns_labels_unique_across_init_and_app_containers() {
    let mut p = pod();
    p["spec"]["initContainers"] = json!([{"name": "nginx", "image": "busybox"}]);
    let errs = errors(Kind::Pod, p);
    assert_eq!(
        error_at(&errs, "spec.containers[0].name").to_string(),
        "spec.containers[0].name: Duplicate value: \"nginx\""
    );

    let mut p = pod();
    p["spec"]["containers"][0]["name"] = json!("Nginx");
    assert!(error_at(&errors(Kind::Pod, p), "spec.containers[0].name")
        .detail
        .starts_with("a lowercase RFC 1123 label"));
}

#[test]
fn a_pod_container_needs_an_image_but_a_template_may_leave_it_out() {
    let mut p = pod();
    p["spec"]["containers"][0].as_object_mut().unwrap().remove("image");
    assert_eq!(
        error_at(&errors(Kind::Pod, p), "spec.containers[0].image").to_string(),
        "spec.containers[0].image: Required value"
    );
    let mut d = deployment();
    d["spec"]["template"]["spec"]["containers"][0].as_object_mut().unwrap().remove("image");
    assert_valid(Kind::Deployment, d);
}

#[test]
fn container_ports_are_in_range_with_a_known_protocol() {
    let mut p = pod();
    p["spec"]["containers"][0]["ports"] =
        json!([{"containerPort": 70000}, {"containerPort": 53, "protocol": "HTTP"}, {"containerPort": 0}]);
    let errs = errors(Kind::Pod, p);
    assert_eq!(
        error_at(&errs, "spec.containers[0].ports[0].containerPort").to_string(),
        "spec.containers[0].ports[0].containerPort: Invalid value: 70000: must be between 1 and 65535, inclusive"
    );
    assert_eq!(
        error_at(&errs, "spec.containers[0].ports[1].protocol").to_string(),
        "spec.containers[0].ports[1].protocol: Unsupported value: \"HTTP\": supported values: \"SCTP\", \"TCP\", \"UDP\""
    );
    assert_eq!(error_at(&errs, "spec.containers[0].ports[2].containerPort").reason(), "FieldValueRequired");
}

#[test]
fn the_restart_policy_is_always_on_failure_or_never() {
    let mut p = pod();
    p["spec"]["restartPolicy"] = json!("Sometimes");
    assert_eq!(
        error_at(&errors(Kind::Pod, p), "spec.restartPolicy").to_string(),
        "spec.restartPolicy: Unsupported value: \"Sometimes\": supported values: \"Always\", \"OnFailure\", \"Never\""
    );
}

#[test]
fn environment_variables_need_printable_names_without_equals() {
    let mut p = pod();
    p["spec"]["containers"][0]["env"] =
        json!([{"name": "A=B", "value": "x"}, {"name": "", "value": "y"}, {"name": "my.var-1"}]);
    let errs = errors(Kind::Pod, p);
    assert_eq!(
        error_at(&errs, "spec.containers[0].env[0].name").detail,
        "a valid environment variable name must consist only of printable ASCII characters other than '='"
    );
    assert_eq!(error_at(&errs, "spec.containers[0].env[1].name").reason(), "FieldValueRequired");
    assert_eq!(errs.len(), 2, "{errs:#?}");
}

#[test]
fn requests_may_not_exceed_limits() {
    let mut p = pod();
    p["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "1"}, "limits": {"cpu": "500m"}});
    let errs = errors(Kind::Pod, p);
    assert_eq!(
        error_at(&errs, "spec.containers[0].resources.requests").to_string(),
        "spec.containers[0].resources.requests: Invalid value: \"1\": must be less than or equal to cpu limit of 500m"
    );
    let mut p = pod();
    p["spec"]["containers"][0]["resources"] = json!({"limits": {"cpu": "-1", "gpu": "1", "memory": "lots"}});
    let errs = errors(Kind::Pod, p);
    assert!(errs
        .iter()
        .any(|e| e.field == "spec.containers[0].resources.limits[cpu]"
            && e.detail == "must be greater than or equal to 0"));
    assert!(errs.iter().any(|e| e.field == "spec.containers[0].resources.limits[gpu]"
        && e.detail == "must be a standard resource for containers"));
    assert!(errs
        .iter()
        .any(|e| e.field == "spec.containers[0].resources.limits[memory]"
            && e.detail.starts_with("quantities must match")));
}

#[test]
fn volumes_have_unique_names_and_mounts_refer_to_them() {
    let mut p = pod();
    p["spec"]["volumes"] = json!([{"name": "data", "emptyDir": {}}, {"name": "data", "configMap": {"name": "cfg"}}]);
    p["spec"]["containers"][0]["volumeMounts"] =
        json!([{"name": "data", "mountPath": "/data"}, {"name": "cache", "mountPath": "/data"}]);
    let errs = errors(Kind::Pod, p);
    assert_eq!(error_at(&errs, "spec.volumes[1].name").to_string(), "spec.volumes[1].name: Duplicate value: \"data\"");
    assert!(errs.iter().any(|e| e.field == "spec.containers[0].volumeMounts[1].name"
        && e.kind == FieldErrorKind::Invalid("\"cache\"".into())));
    assert!(errs
        .iter()
        .any(|e| e.field == "spec.containers[0].volumeMounts[1].mountPath" && e.detail == "must be unique"));

    let mut p = pod();
    p["spec"]["volumes"] = json!([{"name": "data", "emptyDir": {}, "hostPath": {"path": "/tmp"}}]);
    let errs = errors(Kind::Pod, p);
    assert_eq!(error_at(&errs, "spec.volumes[0].hostPath").detail, "may not specify more than 1 volume type");
}

#[test]
fn probes_need_one_handler_and_liveness_success_threshold_one() {
    let mut p = pod();
    p["spec"]["containers"][0]["livenessProbe"] =
        json!({"tcpSocket": {"port": 80}, "exec": {"command": ["true"]}, "successThreshold": 2});
    p["spec"]["containers"][0]["readinessProbe"] = json!({"periodSeconds": 5});
    let errs = errors(Kind::Pod, p);
    assert_eq!(
        error_at(&errs, "spec.containers[0].readinessProbe").to_string(),
        "spec.containers[0].readinessProbe: Required value: must specify a handler type"
    );
    assert_eq!(error_at(&errs, "spec.containers[0].livenessProbe.successThreshold").detail, "must be 1");
    assert_eq!(error_at(&errs, "spec.containers[0].livenessProbe.tcpSocket").reason(), "FieldValueForbidden");
}

#[test]
fn tolerations_follow_the_kubernetes_rules() {
    let mut p = pod();
    p["spec"]["tolerations"] = json!([
        {"operator": "Exists"},
        {"key": "dedicated", "operator": "Equal", "value": "db", "effect": "NoSchedule"},
        {"key": "k", "operator": "Sometimes"},
        {"key": "k", "effect": "NoSchedule", "tolerationSeconds": 30},
        {"operator": "Equal", "value": "x"}
    ]);
    let errs = errors(Kind::Pod, p);
    assert_eq!(error_at(&errs, "spec.tolerations[2].operator").reason(), "FieldValueNotSupported");
    assert_eq!(
        error_at(&errs, "spec.tolerations[3].effect").detail,
        "effect must be 'NoExecute' when `tolerationSeconds` is set"
    );
    assert!(error_at(&errs, "spec.tolerations[4].operator")
        .detail
        .starts_with("operator must be Exists when `key` is empty"));
    assert_eq!(errs.len(), 3, "{errs:#?}");
}

#[test]
fn a_pod_update_may_change_images_but_not_other_spec_fields() {
    let old = pod();
    let mut new = pod();
    new["spec"]["containers"][0]["image"] = json!("nginx:1.26");
    new["spec"]["activeDeadlineSeconds"] = json!(600);
    assert!(update_errors(Kind::Pod, old.clone(), new).is_empty());

    let mut new = pod();
    new["spec"]["restartPolicy"] = json!("Never");
    let errs = update_errors(Kind::Pod, old.clone(), new);
    let e = error_at(&errs, "spec");
    assert_eq!(e.reason(), "FieldValueForbidden");
    assert!(
        e.detail.starts_with("pod updates may not change fields other than `spec.containers[*].image`,"),
        "{}",
        e.detail
    );
    assert!(e.detail.contains("spec.restartPolicy"));

    let mut new = pod();
    new["spec"]["containers"].as_array_mut().unwrap().push(json!({"name": "sidecar", "image": "envoy"}));
    assert_eq!(error_at(&update_errors(Kind::Pod, old, new), "spec").reason(), "FieldValueForbidden");
}

#[test]
fn a_pod_update_may_add_tolerations_and_shorten_the_deadline_only() {
    let mut old = pod();
    old["spec"]["tolerations"] = json!([{"key": "a", "operator": "Exists"}]);
    old["spec"]["activeDeadlineSeconds"] = json!(300);
    let mut new = old.clone();
    new["spec"]["tolerations"] = json!([{"key": "a", "operator": "Exists"}, {"key": "b", "operator": "Exists"}]);
    new["spec"]["activeDeadlineSeconds"] = json!(100);
    assert!(update_errors(Kind::Pod, old.clone(), new).is_empty());

    let mut new = old.clone();
    new["spec"]["tolerations"] = json!([{"key": "b", "operator": "Exists"}]);
    let errs = update_errors(Kind::Pod, old.clone(), new);
    assert_eq!(
        error_at(&errs, "spec.tolerations").detail,
        "existing toleration can not be modified except its tolerationSeconds"
    );

    let mut new = old.clone();
    new["spec"]["activeDeadlineSeconds"] = json!(400);
    let errs = update_errors(Kind::Pod, old, new);
    assert_eq!(error_at(&errs, "spec.activeDeadlineSeconds").detail, "must be less than or equal to previous value");
}

// ---- services

#[test]
fn a_service_needs_ports_unless_headless_or_external_name() {
    let mut s = service();
    s["spec"]["ports"] = json!([]);
    assert_eq!(error_at(&errors(Kind::Service, s.clone()), "spec.ports").to_string(), "spec.ports: Required value");
    s["spec"]["clusterIP"] = json!("None");
    assert_valid(Kind::Service, s);
    assert_valid(
        Kind::Service,
        json!({"metadata": {"name": "db", "namespace": "default"}, "spec": {"type": "ExternalName", "externalName": "db.example.com."}}),
    );
    let errs = errors(
        Kind::Service,
        json!({"metadata": {"name": "db", "namespace": "default"}, "spec": {"type": "ExternalName"}}),
    );
    assert_eq!(error_at(&errs, "spec.externalName").reason(), "FieldValueRequired");
}

#[test]
fn service_ports_are_named_and_unique_when_there_are_several() {
    let mut s = service();
    s["spec"]["ports"] = json!([{"port": 80}, {"port": 443, "name": "https"}, {"port": 8443, "name": "https"}, {"port": 0, "name": "zero"}]);
    let errs = errors(Kind::Service, s);
    assert_eq!(error_at(&errs, "spec.ports[0].name").to_string(), "spec.ports[0].name: Required value");
    assert_eq!(error_at(&errs, "spec.ports[2].name").to_string(), "spec.ports[2].name: Duplicate value: \"https\"");
    assert_eq!(error_at(&errs, "spec.ports[3].port").detail, "must be between 1 and 65535, inclusive");
}

#[test]
fn service_types_and_node_ports_are_checked() {
    let mut s = service();
    s["spec"]["type"] = json!("Internal");
    assert_eq!(
        error_at(&errors(Kind::Service, s), "spec.type").to_string(),
        "spec.type: Unsupported value: \"Internal\": supported values: \"ClusterIP\", \"ExternalName\", \"LoadBalancer\", \"NodePort\""
    );
    let mut s = service();
    s["spec"]["type"] = json!("NodePort");
    s["spec"]["ports"][0]["nodePort"] = json!(8080);
    assert_eq!(
        error_at(&errors(Kind::Service, s.clone()), "spec.ports[0].nodePort").detail,
        "provided port is not in the valid range. The range of valid ports is 30000-32767"
    );
    s["spec"]["ports"][0]["nodePort"] = json!(30080);
    assert_valid(Kind::Service, s.clone());
    s["spec"]["type"] = json!("ClusterIP");
    s["spec"].as_object_mut().unwrap().remove("externalTrafficPolicy");
    assert_eq!(
        error_at(&errors(Kind::Service, s), "spec.ports[0].nodePort").to_string(),
        "spec.ports[0].nodePort: Forbidden: may not be used when `type` is 'ClusterIP'"
    );
}

#[test]
fn target_ports_are_port_numbers_or_iana_names() {
    let mut s = service();
    s["spec"]["ports"][0]["targetPort"] = json!("HTTP_PORT");
    let errs = errors(Kind::Service, s);
    assert!(error_at(&errs, "spec.ports[0].targetPort")
        .detail
        .starts_with("must contain only alpha-numeric characters"));
    let mut s = service();
    s["spec"]["ports"][0]["targetPort"] = json!(99999);
    assert_eq!(
        error_at(&errors(Kind::Service, s), "spec.ports[0].targetPort").detail,
        "must be between 1 and 65535, inclusive"
    );
}

#[test]
fn a_cluster_ip_may_be_set_once_but_not_changed() {
    let mut old = service();
    old["spec"]["clusterIP"] = json!("10.96.0.10");
    let mut new = old.clone();
    new["spec"]["clusterIP"] = json!("10.96.0.11");
    let errs = update_errors(Kind::Service, old.clone(), new);
    assert_eq!(
        error_at(&errs, "spec.clusterIP").to_string(),
        "spec.clusterIP: Invalid value: \"10.96.0.11\": field is immutable"
    );
    // The allocator setting it on an unset service is fine.
    assert!(update_errors(Kind::Service, service(), old).is_empty());
    let mut s = service();
    s["spec"]["clusterIP"] = json!("10.96.0.300");
    assert_eq!(
        error_at(&errors(Kind::Service, s), "spec.clusterIP").detail,
        "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"
    );
}

// ---- deployments, replica sets, daemon sets

#[test]
fn a_deployment_whose_selector_misses_the_template_labels_is_invalid() {
    let mut d = deployment();
    d["spec"]["selector"] = json!({"matchLabels": {"app": "api"}});
    let errs = errors(Kind::Deployment, d);
    assert_eq!(
        error_at(&errs, "spec.template.metadata.labels").to_string(),
        "spec.template.metadata.labels: Invalid value: {\"app\":\"web\"}: `selector` does not match template `labels`"
    );
    let mut d = deployment();
    d["spec"]["selector"] = json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["web", "api"]}]});
    assert_valid(Kind::Deployment, d);
}

#[test]
fn a_deployment_needs_a_non_empty_valid_selector() {
    let mut d = deployment();
    d["spec"].as_object_mut().unwrap().remove("selector");
    let errs = errors(Kind::Deployment, d);
    assert_eq!(error_at(&errs, "spec.selector").detail, "empty selector is invalid for deployment");

    let mut d = deployment();
    d["spec"]["selector"] = json!({"matchExpressions": [{"key": "app", "operator": "Near", "values": ["web"]}]});
    let errs = errors(Kind::Deployment, d);
    assert_eq!(error_at(&errs, "spec.selector.matchExpressions[0].operator").detail, "not a valid selector operator");
}

#[test]
fn replicas_may_not_be_negative() {
    let mut d = deployment();
    d["spec"]["replicas"] = json!(-1);
    assert_eq!(
        error_at(&errors(Kind::Deployment, d), "spec.replicas").to_string(),
        "spec.replicas: Invalid value: -1: must be greater than or equal to 0"
    );
}

#[test]
fn a_deployment_template_is_a_pod_spec_that_always_restarts() {
    let mut d = deployment();
    d["spec"]["template"]["spec"]["restartPolicy"] = json!("Never");
    d["spec"]["template"]["spec"]["containers"][0]["name"] = json!("Nginx");
    let errs = errors(Kind::Deployment, d);
    assert_eq!(
        error_at(&errs, "spec.template.spec.restartPolicy").to_string(),
        "spec.template.spec.restartPolicy: Unsupported value: \"Never\": supported values: \"Always\""
    );
    assert!(error_at(&errs, "spec.template.spec.containers[0].name").detail.starts_with("a lowercase RFC 1123 label"));
}

#[test]
fn a_rolling_update_may_not_have_both_surge_and_unavailability_zero() {
    let mut d = deployment();
    d["spec"]["strategy"] = json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": "0%"}});
    assert_eq!(
        error_at(&errors(Kind::Deployment, d), "spec.strategy.rollingUpdate.maxUnavailable").detail,
        "may not be 0 when `maxSurge` is 0"
    );
    let mut d = deployment();
    d["spec"]["strategy"] =
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "1/2", "maxUnavailable": "150%"}});
    let errs = errors(Kind::Deployment, d);
    assert!(error_at(&errs, "spec.strategy.rollingUpdate.maxSurge").detail.starts_with("a valid percent string"));
    assert_eq!(error_at(&errs, "spec.strategy.rollingUpdate.maxUnavailable").detail, "must not be greater than 100%");
    let mut d = deployment();
    d["spec"]["strategy"] = json!({"type": "BlueGreen"});
    assert_eq!(error_at(&errors(Kind::Deployment, d), "spec.strategy.type").reason(), "FieldValueNotSupported");
    let mut d = deployment();
    d["spec"]["strategy"] = json!({"type": "Recreate"});
    assert_valid(Kind::Deployment, d);
}

#[test]
fn a_workload_selector_is_immutable() {
    let mut new = deployment();
    new["spec"]["selector"] = json!({"matchLabels": {"app": "web", "tier": "front"}});
    new["spec"]["template"]["metadata"]["labels"]["tier"] = json!("front");
    let errs = update_errors(Kind::Deployment, deployment(), new);
    assert_eq!(error_at(&errs, "spec.selector").detail, "field is immutable");
    let mut scaled = deployment();
    scaled["spec"]["replicas"] = json!(10);
    assert!(update_errors(Kind::Deployment, deployment(), scaled).is_empty());
}

#[test]
fn replica_sets_and_daemon_sets_check_selectors_like_deployments() {
    let mut rs = deployment();
    rs["kind"] = json!("ReplicaSet");
    rs["spec"]["template"]["metadata"]["labels"] = json!({"app": "other"});
    assert_eq!(
        error_at(&errors(Kind::ReplicaSet, rs), "spec.template.metadata.labels").detail,
        "`selector` does not match template `labels`"
    );

    let mut ds = deployment();
    ds["spec"].as_object_mut().unwrap().remove("replicas");
    ds["spec"]["selector"] = json!({});
    let errs = errors(Kind::DaemonSet, ds);
    assert_eq!(error_at(&errs, "spec.selector").detail, "empty selector is invalid for daemonset");
    let mut ds = deployment();
    ds["spec"].as_object_mut().unwrap().remove("replicas");
    ds["spec"]["updateStrategy"] =
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 0}});
    assert_eq!(
        error_at(&errors(Kind::DaemonSet, ds), "spec.updateStrategy.rollingUpdate.maxUnavailable").to_string(),
        "spec.updateStrategy.rollingUpdate.maxUnavailable: Required value: cannot be 0 when maxSurge is 0"
    );
}

#[test]
fn a_recreate_deployment_may_not_carry_rolling_update_parameters() {
    let mut d = deployment();
    d["spec"]["strategy"] = json!({"type": "Recreate", "rollingUpdate": {"maxSurge": 1}});
    assert_eq!(
        error_at(&errors(Kind::Deployment, d), "spec.strategy.rollingUpdate").to_string(),
        "spec.strategy.rollingUpdate: Forbidden: may not be specified when strategy `type` is 'Recreate'"
    );
}

#[test]
fn a_replication_controller_selector_must_match_its_template_labels() {
    let mut rc = replication_controller();
    rc["spec"]["selector"] = json!({"app": "api"});
    assert_eq!(
        error_at(&errors(Kind::ReplicationController, rc), "spec.template.metadata.labels").to_string(),
        "spec.template.metadata.labels: Invalid value: {\"app\":\"web\"}: `selector` does not match template `labels`"
    );
    let mut rc = replication_controller();
    rc["spec"]["template"]["spec"]["restartPolicy"] = json!("OnFailure");
    rc["spec"]["replicas"] = json!(-2);
    let errs = errors(Kind::ReplicationController, rc);
    assert_eq!(error_at(&errs, "spec.template.spec.restartPolicy").reason(), "FieldValueNotSupported");
    assert_eq!(error_at(&errs, "spec.replicas").detail, "must be greater than or equal to 0");
}

#[test]
fn a_replication_controller_without_a_selector_selects_its_template_labels() {
    let mut rc = replication_controller();
    rc["spec"].as_object_mut().unwrap().remove("selector");
    let prepared = prepare(Kind::ReplicationController, rc);
    assert_eq!(prepared["spec"]["selector"], json!({"app": "web"}));
    assert_eq!(prepared["metadata"]["labels"], json!({"app": "web"}));
    assert!(validate(of(Kind::ReplicationController), &prepared, None).is_empty());

    let mut rc = replication_controller();
    rc["spec"].as_object_mut().unwrap().remove("selector");
    rc["spec"]["template"]["metadata"] = json!({});
    let errs = errors(Kind::ReplicationController, rc);
    assert_eq!(error_at(&errs, "spec.selector").reason(), "FieldValueRequired");
}

#[test]
fn a_replication_controller_selector_may_change() {
    let mut new = replication_controller();
    new["spec"]["selector"] = json!({"app": "web", "tier": "front"});
    new["spec"]["template"]["metadata"]["labels"]["tier"] = json!("front");
    assert!(update_errors(Kind::ReplicationController, replication_controller(), new).is_empty());
}

// ---- jobs and cron jobs

#[test]
fn a_job_template_restarts_never_or_on_failure() {
    let mut j = job();
    j["spec"]["template"]["spec"].as_object_mut().unwrap().remove("restartPolicy");
    assert_eq!(
        error_at(&errors(Kind::Job, j), "spec.template.spec.restartPolicy").to_string(),
        "spec.template.spec.restartPolicy: Unsupported value: \"Always\": supported values: \"OnFailure\", \"Never\""
    );
}

#[test]
fn job_counts_may_not_be_negative() {
    let mut j = job();
    j["spec"]["parallelism"] = json!(-1);
    j["spec"]["completions"] = json!(-2);
    j["spec"]["backoffLimit"] = json!(-3);
    let errs = errors(Kind::Job, j);
    for field in ["spec.parallelism", "spec.completions", "spec.backoffLimit"] {
        assert_eq!(error_at(&errs, field).detail, "must be greater than or equal to 0");
    }
}

#[test]
fn an_indexed_job_needs_completions_and_bounded_parallelism() {
    let mut j = job();
    j["spec"]["completionMode"] = json!("Indexed");
    j["spec"]["parallelism"] = json!(100_001);
    let errs = errors(Kind::Job, j.clone());
    assert_eq!(error_at(&errs, "spec.completions").reason(), "FieldValueRequired");
    assert_eq!(
        error_at(&errs, "spec.parallelism").detail,
        "must be less than or equal to 100000 when completion mode is Indexed"
    );
    j["spec"]["completions"] = json!(10_000);
    j["spec"]["parallelism"] = json!(100);
    assert_valid(Kind::Job, j);
}

#[test]
fn a_manual_job_selector_must_be_given_and_match_the_template() {
    let mut j = job();
    j["spec"]["manualSelector"] = json!(true);
    assert_eq!(error_at(&errors(Kind::Job, j.clone()), "spec.selector").reason(), "FieldValueRequired");
    j["spec"]["selector"] = json!({"matchLabels": {"app": "batch"}});
    assert_eq!(
        error_at(&errors(Kind::Job, j), "spec.template.metadata.labels").detail,
        "`selector` does not match template `labels`"
    );
}

#[test]
fn a_jobs_selector_and_template_are_immutable_but_parallelism_is_not() {
    let mut old = job();
    old["spec"]["selector"] = json!({"matchLabels": {"app": "web"}});
    let mut new = old.clone();
    new["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:1.26");
    new["spec"]["selector"] = json!({"matchLabels": {"app": "web", "x": "y"}});
    new["spec"]["template"]["metadata"]["labels"]["x"] = json!("y");
    let errs = update_errors(Kind::Job, old.clone(), new);
    assert_eq!(error_at(&errs, "spec.template").detail, "field is immutable");
    assert_eq!(error_at(&errs, "spec.selector").detail, "field is immutable");
    // Edited from the stored object, as clients do (it has `completions: 1`).
    let stored = prepare(Kind::Job, old);
    let mut new = stored.clone();
    new["spec"]["parallelism"] = json!(4);
    let errs = validate(of(Kind::Job), &prepare(Kind::Job, new), Some(&stored));
    assert!(errs.is_empty(), "{errs:#?}");
}

#[test]
fn a_cron_job_needs_a_valid_schedule_and_policy() {
    let mut c = cron_job();
    c["spec"]["schedule"] = json!("*/5 * * *");
    assert_eq!(
        error_at(&errors(Kind::CronJob, c), "spec.schedule").to_string(),
        "spec.schedule: Invalid value: \"*/5 * * *\": expected exactly 5 fields, found 4: [*/5 * * *]"
    );
    let mut c = cron_job();
    c["spec"]["schedule"] = json!("@weekly");
    assert_valid(Kind::CronJob, c);
    let mut c = cron_job();
    c["spec"]["schedule"] = json!("");
    c["spec"]["concurrencyPolicy"] = json!("Sometimes");
    let errs = errors(Kind::CronJob, c);
    assert_eq!(error_at(&errs, "spec.schedule").reason(), "FieldValueRequired");
    assert_eq!(
        error_at(&errs, "spec.concurrencyPolicy").to_string(),
        "spec.concurrencyPolicy: Unsupported value: \"Sometimes\": supported values: \"Allow\", \"Forbid\", \"Replace\""
    );
    let mut c = cron_job();
    c["spec"]["schedule"] = json!("CRON_TZ=UTC 0 3 * * *");
    assert_eq!(
        error_at(&errors(Kind::CronJob, c), "spec.schedule").detail,
        "cannot use TZ or CRON_TZ in schedule, use timeZone field instead"
    );
}

#[test]
fn a_cron_jobs_time_zone_must_be_a_known_iana_zone() {
    let mut c = cron_job();
    c["spec"]["timeZone"] = json!("Europe/Berlin");
    assert_valid(Kind::CronJob, c);
    let mut c = cron_job();
    c["spec"]["timeZone"] = json!("Mars/Olympus");
    assert_eq!(
        error_at(&errors(Kind::CronJob, c), "spec.timeZone").to_string(),
        "spec.timeZone: Invalid value: \"Mars/Olympus\": unknown time zone Mars/Olympus"
    );
    for bad in ["", "Local"] {
        let mut c = cron_job();
        c["spec"]["timeZone"] = json!(bad);
        assert_eq!(error_at(&errors(Kind::CronJob, c), "spec.timeZone").reason(), "FieldValueInvalid", "{bad:?}");
    }
}

#[test]
fn a_cron_jobs_job_template_is_validated_like_a_job() {
    let mut c = cron_job();
    c["spec"]["jobTemplate"]["spec"]["template"]["spec"]["restartPolicy"] = json!("Always");
    c["spec"]["jobTemplate"]["spec"]["backoffLimit"] = json!(-1);
    c["metadata"]["name"] = json!("a".repeat(53));
    let errs = errors(Kind::CronJob, c);
    assert_eq!(error_at(&errs, "spec.jobTemplate.spec.template.spec.restartPolicy").reason(), "FieldValueNotSupported");
    assert_eq!(error_at(&errs, "spec.jobTemplate.spec.backoffLimit").detail, "must be greater than or equal to 0");
    assert_eq!(error_at(&errs, "metadata.name").detail, "must be no more than 52 characters");
}

// ---- config maps and secrets

#[test]
fn config_map_keys_are_file_names_and_the_data_at_most_one_mib() {
    let cm = json!({"metadata": {"name": "cfg", "namespace": "default"}, "data": {"bad/key": "x", "..hidden": "y", "ok_key-1.txt": "z"}});
    let errs = errors(Kind::ConfigMap, cm);
    assert!(error_at(&errs, "data[bad/key]")
        .detail
        .starts_with("a valid config key must consist of alphanumeric characters, '-', '_' or '.'"));
    assert_eq!(error_at(&errs, "data[..hidden]").detail, "must not start with '..'");
    let cm = json!({"metadata": {"name": "cfg", "namespace": "default"}, "data": {"big": "x".repeat(1024 * 1024 + 1)}});
    assert_eq!(error_at(&errors(Kind::ConfigMap, cm), "").reason(), "FieldValueTooLong");
}

#[test]
fn immutable_config_maps_and_secrets_keep_their_data() {
    let old = json!({"metadata": {"name": "cfg", "namespace": "default"}, "immutable": true, "data": {"a": "1"}});
    let mut new = old.clone();
    new["data"]["a"] = json!("2");
    let errs = update_errors(Kind::ConfigMap, old.clone(), new);
    assert_eq!(error_at(&errs, "data").to_string(), "data: Forbidden: field is immutable when `immutable` is set");
    let mut new = old.clone();
    new["immutable"] = json!(false);
    assert_eq!(error_at(&update_errors(Kind::ConfigMap, old, new), "immutable").reason(), "FieldValueForbidden");

    let old = json!({"metadata": {"name": "s", "namespace": "default"}, "immutable": true, "stringData": {"a": "1"}});
    let mut new = old.clone();
    new["stringData"]["a"] = json!("2");
    assert_eq!(error_at(&update_errors(Kind::Secret, old, new), "data").reason(), "FieldValueForbidden");
    // Mutable ones may change.
    let old = json!({"metadata": {"name": "cfg", "namespace": "default"}, "data": {"a": "1"}});
    assert!(update_errors(
        Kind::ConfigMap,
        old,
        json!({"metadata": {"name": "cfg", "namespace": "default"}, "data": {"a": "2"}})
    )
    .is_empty());
}

#[test]
fn typed_secrets_need_their_keys_and_keep_their_type() {
    let tls = json!({"metadata": {"name": "tls", "namespace": "default"}, "type": "kubernetes.io/tls", "stringData": {"tls.crt": "cert"}});
    let errs = errors(Kind::Secret, tls.clone());
    assert_eq!(error_at(&errs, "data[tls.key]").to_string(), "data[tls.key]: Required value");
    let mut opaque = tls.clone();
    opaque["type"] = json!("Opaque");
    let errs = update_errors(Kind::Secret, opaque, tls);
    assert_eq!(error_at(&errs, "type").detail, "field is immutable");
}

// ---- the rarer kinds

#[test]
fn a_lease_lasts_a_positive_number_of_seconds() {
    let l = json!({"metadata": {"name": "n", "namespace": "kube-node-lease"}, "spec": {"leaseDurationSeconds": 0}});
    assert_eq!(
        error_at(&errors(Kind::Lease, l), "spec.leaseDurationSeconds").to_string(),
        "spec.leaseDurationSeconds: Invalid value: 0: must be greater than 0"
    );
}

#[test]
fn endpoint_slice_addresses_match_their_type_and_the_type_is_immutable() {
    let slice = json!({"metadata": {"name": "web-1", "namespace": "default"}, "addressType": "IPv6",
                       "endpoints": [{"addresses": ["10.0.0.1"]}, {"addresses": []}],
                       "ports": [{"name": "http", "port": 80, "protocol": "TCP"}, {"name": "http", "port": 0, "protocol": "XTP"}]});
    let errs = errors(Kind::EndpointSlice, slice);
    assert_eq!(error_at(&errs, "endpoints[0].addresses[0]").detail, "must be a valid IPv6 address");
    assert_eq!(error_at(&errs, "endpoints[1].addresses").reason(), "FieldValueRequired");
    assert_eq!(error_at(&errs, "ports[1].name").reason(), "FieldValueDuplicate");
    assert_eq!(error_at(&errs, "ports[1].port").reason(), "FieldValueInvalid");
    assert_eq!(error_at(&errs, "ports[1].protocol").reason(), "FieldValueNotSupported");
    let bad_type =
        json!({"metadata": {"name": "web-1", "namespace": "default"}, "addressType": "IPX", "endpoints": []});
    assert_eq!(error_at(&errors(Kind::EndpointSlice, bad_type), "addressType").reason(), "FieldValueNotSupported");

    let old = json!({"metadata": {"name": "web-1", "namespace": "default", "resourceVersion": "1"},
                     "addressType": "IPv4", "endpoints": []});
    let mut new = old.clone();
    new["addressType"] = json!("IPv6");
    let errs = update_errors(Kind::EndpointSlice, old, new);
    assert_eq!(error_at(&errs, "addressType").detail, "field is immutable");
}

#[test]
fn a_user_priority_class_needs_a_value_of_at_most_a_billion_and_no_system_prefix() {
    let missing = errors(Kind::PriorityClass, json!({"metadata": {"name": "high"}}));
    assert_eq!(error_at(&missing, "value").reason(), "FieldValueRequired");
    let too_high = errors(Kind::PriorityClass, json!({"metadata": {"name": "high"}, "value": 1_000_000_001}));
    assert_eq!(error_at(&too_high, "value").detail, "maximum allowed value of a user defined priority is 1000000000");
    assert!(errors(Kind::PriorityClass, json!({"metadata": {"name": "high"}, "value": 1_000_000_000})).is_empty());
    assert!(errors(Kind::PriorityClass, json!({"metadata": {"name": "low"}, "value": -10})).is_empty());
    let reserved = errors(Kind::PriorityClass, json!({"metadata": {"name": "system-mine"}, "value": 5}));
    assert_eq!(
        error_at(&reserved, "metadata.name").detail,
        "priority class names with 'system-' prefix are reserved for system use only. error: system-mine is not a known system priority class"
    );
    let wrong_value = errors(Kind::PriorityClass, json!({"metadata": {"name": "system-node-critical"}, "value": 5}));
    assert_eq!(error_at(&wrong_value, "metadata.name").reason(), "FieldValueForbidden");
    let policy =
        errors(Kind::PriorityClass, json!({"metadata": {"name": "high"}, "value": 1, "preemptionPolicy": "Always"}));
    assert_eq!(error_at(&policy, "preemptionPolicy").reason(), "FieldValueNotSupported");
}

#[test]
fn a_priority_class_keeps_its_value_and_preemption_policy() {
    let old = json!({"metadata": {"name": "high", "resourceVersion": "1"}, "value": 1000});
    let mut new = old.clone();
    new["value"] = json!(2000);
    new["preemptionPolicy"] = json!("Never");
    new["description"] = json!("may change");
    let errs = update_errors(Kind::PriorityClass, old.clone(), new);
    assert_eq!(error_at(&errs, "value").detail, "may not be changed in an update.");
    assert_eq!(error_at(&errs, "preemptionPolicy").detail, "field is immutable");
    let mut described = old.clone();
    described["description"] = json!("may change");
    described["globalDefault"] = json!(true);
    assert!(update_errors(Kind::PriorityClass, old, described).is_empty());
}

#[test]
fn a_pod_preemption_policy_is_never_or_preempt_lower_priority() {
    let mut p = pod();
    p["spec"]["preemptionPolicy"] = json!("Sometimes");
    assert_eq!(error_at(&errors(Kind::Pod, p), "spec.preemptionPolicy").reason(), "FieldValueNotSupported");
}

#[test]
fn endpoint_addresses_need_an_ip() {
    let ep = json!({"metadata": {"name": "web", "namespace": "default"},
                    "subsets": [{"addresses": [{"ip": ""}, {"ip": "not-an-ip"}], "ports": [{"port": 80}, {"port": 443}]}, {"ports": [{"port": 1}]}]});
    let errs = errors(Kind::Endpoints, ep);
    assert_eq!(error_at(&errs, "subsets[0].addresses[0].ip").reason(), "FieldValueRequired");
    assert_eq!(error_at(&errs, "subsets[0].addresses[1].ip").reason(), "FieldValueInvalid");
    assert_eq!(error_at(&errs, "subsets[0].ports[0].name").reason(), "FieldValueRequired");
    assert_eq!(error_at(&errs, "subsets[1]").detail, "must specify `addresses` or `notReadyAddresses`");
}

#[test]
fn quota_and_limit_range_quantities_are_checked() {
    let q = json!({"metadata": {"name": "q", "namespace": "default"}, "spec": {"hard": {"cpu": "-1", "pods": "1.5", "memory": "1Gi"}}});
    let errs = errors(Kind::ResourceQuota, q);
    assert_eq!(
        error_at(&errs, "spec.hard[cpu]").to_string(),
        "spec.hard[cpu]: Invalid value: \"-1\": must be greater than or equal to 0"
    );
    assert_eq!(error_at(&errs, "spec.hard[pods]").detail, "must be an integer");
    assert_eq!(errs.len(), 2);

    let lr = json!({"metadata": {"name": "l", "namespace": "default"},
                    "spec": {"limits": [{"type": "Node"}, {"type": "Container", "min": {"cpu": "2"}, "max": {"cpu": "1"}}, {"type": "Pod", "default": {"cpu": "1"}}]}});
    let errs = errors(Kind::LimitRange, lr);
    assert_eq!(error_at(&errs, "spec.limits[0].type").detail, "must be a standard limit type or fully qualified");
    assert!(errs
        .iter()
        .any(|e| e.field == "spec.limits[1].min[cpu]" && e.detail == "min value 2 is greater than max value 1"));
    assert_eq!(error_at(&errs, "spec.limits[2].default").detail, "may not be specified when `type` is 'Pod'");
}

#[test]
fn events_name_their_object_in_their_namespace() {
    let ev = json!({"metadata": {"name": "e", "namespace": "default"}, "involvedObject": {"kind": "Pod", "namespace": "other"}});
    let errs = errors(Kind::Event, ev);
    assert_eq!(error_at(&errs, "involvedObject.name").reason(), "FieldValueRequired");
    assert_eq!(error_at(&errs, "involvedObject.namespace").detail, "does not match event.namespace");
}

#[test]
fn node_taints_have_a_known_effect_and_are_unique() {
    let n = json!({"metadata": {"name": "n1"}, "spec": {"taints": [
        {"key": "a", "effect": "NoSchedule"}, {"key": "a", "effect": "NoSchedule"}, {"key": "b", "effect": "Sometimes"}]}});
    let errs = errors(Kind::Node, n);
    assert_eq!(error_at(&errs, "spec.taints[1]").detail, "taints must be unique by key and effect pair");
    assert_eq!(error_at(&errs, "spec.taints[2].effect").reason(), "FieldValueNotSupported");
}

#[test]
fn namespace_finalizers_are_standard_or_qualified() {
    let ns = json!({"metadata": {"name": "a"}, "spec": {"finalizers": ["kubernetes", "cleanup"]}});
    assert_eq!(
        error_at(&errors(Kind::Namespace, ns), "spec.finalizers").detail,
        "name is neither a standard finalizer name nor is it fully qualified"
    );
}

// ---- never panic

/// Arbitrary JSON, biased to the shapes objects have.
fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        (-1e6f64..1e6).prop_map(Value::from),
        "[a-zA-Z0-9 ./:=_%@-]{0,12}".prop_map(Value::String),
        prop_oneof![
            Just("500m"),
            Just("1Gi"),
            Just("-1"),
            Just("*/5 * * * *"),
            Just("Always"),
            Just("None"),
            Just("25%")
        ]
        .prop_map(Value::from),
    ];
    let keys = prop_oneof![
        Just("metadata"),
        Just("name"),
        Just("namespace"),
        Just("spec"),
        Just("containers"),
        Just("image"),
        Just("ports"),
        Just("port"),
        Just("selector"),
        Just("matchLabels"),
        Just("template"),
        Just("labels"),
        Just("resources"),
        Just("limits"),
        Just("requests"),
        Just("cpu"),
        Just("data"),
        Just("type"),
        Just("status"),
        Just("volumes"),
        Just("env"),
        Just("strategy"),
        Just("rollingUpdate"),
        Just("x"),
    ]
    .prop_map(String::from);
    leaf.prop_recursive(5, 64, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(keys.clone(), inner, 0..5).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Every path into `v`, as JSON pointers.
fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
    out.push(at.clone());
    match v {
        Value::Object(m) => m.iter().for_each(|(k, v)| pointers(v, format!("{at}/{k}"), out)),
        Value::Array(a) => a.iter().enumerate().for_each(|(i, v)| pointers(v, format!("{at}/{i}"), out)),
        _ => {}
    }
}

fn exercise(kind: Kind, obj: &Value, old: &Value) {
    let info = of(kind);
    let _ = validate(info, obj, None);
    let _ = validate(info, obj, Some(old));
    let mut raw = obj.clone();
    defaults::apply(info, &mut raw);
    if let Ok(mut n) = normalize(info, obj) {
        defaults::apply(info, &mut n);
        let _ = validate(info, &n, None);
        let _ = validate(info, &n, Some(old));
        let _ = validate(info, old, Some(&n));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn normalize_default_and_validate_never_panic_on_arbitrary_json(v in arb_json()) {
        for (kind, sample) in samples() {
            exercise(kind, &v, &prepare(kind, sample));
        }
    }

    #[test]
    fn normalize_default_and_validate_never_panic_on_a_mutated_object(
        which in 0usize..1000, at in any::<prop::sample::Index>(), replacement in arb_json()
    ) {
        let all = samples();
        let (kind, sample) = all[which % all.len()].clone();
        let prepared = prepare(kind, sample.clone());
        for base in [sample, prepared.clone()] {
            let mut ptrs = Vec::new();
            pointers(&base, String::new(), &mut ptrs);
            let ptr = at.get(&ptrs).clone();
            let mut mutated = base.clone();
            if ptr.is_empty() {
                mutated = replacement.clone();
            } else if let Some(slot) = mutated.pointer_mut(&ptr) {
                *slot = replacement.clone();
            }
            exercise(kind, &mutated, &prepared);
        }
    }
}

// ---- RBAC

#[test]
fn rbac_rules_need_verbs_and_either_resources_or_urls() {
    let role =
        |rules: Value| errors(Kind::Role, json!({"metadata": {"name": "r", "namespace": "default"}, "rules": rules}));
    let errs = role(json!([{"apiGroups": [""], "resources": ["pods"]}]));
    assert_eq!(error_at(&errs, "rules[0].verbs").detail, "verbs must contain at least one value");
    let errs = role(json!([{"resources": ["pods"], "verbs": ["get"]}]));
    assert_eq!(error_at(&errs, "rules[0].apiGroups").detail, "resource rules must supply at least one api group");
    let errs = role(json!([{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]));
    assert_eq!(
        error_at(&errs, "rules[0].nonResourceURLs").detail,
        "namespaced rules cannot apply to non-resource URLs"
    );
    let both = json!([{"nonResourceURLs": ["/x"], "apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]);
    let errs = errors(Kind::ClusterRole, json!({"metadata": {"name": "c"}, "rules": both}));
    assert!(error_at(&errs, "rules[0].nonResourceURLs").detail.contains("both"));
    let errs = errors(Kind::ClusterRole, json!({"metadata": {"name": "a/b"}, "aggregationRule": {}}));
    assert_eq!(error_at(&errs, "metadata.name").detail, "may not contain '/'");
    assert!(errs.iter().any(|e| e.field == "aggregationRule.clusterRoleSelectors"), "{errs:?}");
}

#[test]
fn rbac_bindings_refer_to_a_role_they_never_change() {
    let binding = |role_ref: Value, subjects: Value| json!({"metadata": {"name": "b", "namespace": "default"}, "roleRef": role_ref, "subjects": subjects});
    let view = json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"});
    let errs = errors(Kind::RoleBinding, binding(json!({"kind": "Group", "name": "x"}), json!([])));
    assert_eq!(error_at(&errs, "roleRef.kind").reason(), "FieldValueNotSupported");
    assert_eq!(error_at(&errs, "roleRef.apiGroup").reason(), "FieldValueNotSupported");
    let errs =
        errors(Kind::RoleBinding, binding(view.clone(), json!([{"kind": "Robot", "name": "r"}, {"kind": "User"}])));
    assert_eq!(error_at(&errs, "subjects[0].kind").reason(), "FieldValueNotSupported");
    assert_eq!(error_at(&errs, "subjects[1].name").reason(), "FieldValueRequired");
    // A cluster binding's service account must say where it lives.
    let cluster = json!({"metadata": {"name": "b"}, "roleRef": view.clone(), "subjects": [{"kind": "ServiceAccount", "name": "robot"}]});
    let errs = errors(Kind::ClusterRoleBinding, cluster);
    assert_eq!(error_at(&errs, "subjects[0].namespace").reason(), "FieldValueRequired");
    let edit = json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"});
    let errs = update_errors(Kind::RoleBinding, binding(view, json!([])), binding(edit, json!([])));
    assert_eq!(error_at(&errs, "roleRef").detail, "cannot change roleRef");
}

fn budget(spec: Value) -> Value {
    json!({"metadata": {"name": "web", "namespace": "default"}, "spec": spec})
}

#[test]
fn a_disruption_budget_names_one_bound_of_a_valid_size() {
    assert_valid(Kind::PodDisruptionBudget, budget(json!({"maxUnavailable": 1, "selector": {}})));
    assert_valid(Kind::PodDisruptionBudget, budget(json!({"minAvailable": 0})));
    let both = errors(Kind::PodDisruptionBudget, budget(json!({"minAvailable": 1, "maxUnavailable": 1})));
    assert!(error_at(&both, "spec").to_string().contains("minAvailable and maxUnavailable cannot be both set"));
    let negative = errors(Kind::PodDisruptionBudget, budget(json!({"minAvailable": -1})));
    assert!(error_at(&negative, "spec.minAvailable").to_string().contains("must be greater than or equal to 0"));
    let over = errors(Kind::PodDisruptionBudget, budget(json!({"maxUnavailable": "150%"})));
    assert!(error_at(&over, "spec.maxUnavailable").to_string().contains("must not be greater than 100%"));
    let word = errors(Kind::PodDisruptionBudget, budget(json!({"maxUnavailable": "half"})));
    assert!(error_at(&word, "spec.maxUnavailable").to_string().contains("a valid percent string"));
    let policy = errors(
        Kind::PodDisruptionBudget,
        budget(json!({"minAvailable": 1, "unhealthyPodEvictionPolicy": "Sometimes"})),
    );
    assert!(matches!(error_at(&policy, "spec.unhealthyPodEvictionPolicy").kind, FieldErrorKind::NotSupported { .. }));
    let selector = errors(
        Kind::PodDisruptionBudget,
        budget(json!({"minAvailable": 1, "selector": {"matchExpressions": [{"key": "app", "operator": "In"}]}})),
    );
    error_at(&selector, "spec.selector.matchExpressions[0].values");
    let mut status = budget(json!({"minAvailable": 1}));
    status["status"] = json!({"disruptionsAllowed": -1, "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0});
    error_at(&errors(Kind::PodDisruptionBudget, status), "status.disruptionsAllowed");
}

#[test]
fn a_disruption_budget_may_change_its_spec() {
    let old = budget(json!({"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}));
    let new = budget(json!({"maxUnavailable": "25%", "selector": {"matchLabels": {"app": "api"}}}));
    assert!(update_errors(Kind::PodDisruptionBudget, old, new).is_empty());
}
