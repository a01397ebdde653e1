//! Tests of protobuf decoding: bodies captured from kubectl 1.32 against the
//! JSON kubectl prints for the same objects (`--dry-run=client -o json`),
//! hand-encoded bodies for the wrapper types, malformed input, and fuzzing.

use proptest::prelude::*;
use serde_json::json;

use super::*;

/// A fixture captured from kubectl v1.32.4 (`api/tests/fixtures/protobuf/`).
macro_rules! fixture {
    ($name:literal) => {
        include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/protobuf/", $name)) as &[u8]
    };
}

/// (protobuf body from `kubectl create …`, JSON from the same command with `--dry-run=client -o json`).
const KUBECTL_PAIRS: &[(&str, &[u8], &[u8])] = &[
    ("create namespace foo", fixture!("namespace.pb"), fixture!("namespace.json")),
    (
        "create deployment web --image=nginx --replicas=2 --port=80",
        fixture!("deployment.pb"),
        fixture!("deployment.json"),
    ),
    (
        "create deployment zero --image=busybox --replicas=0 -- sleep 3600",
        fixture!("deployment-zero-replicas.pb"),
        fixture!("deployment-zero-replicas.json"),
    ),
    (
        "create configmap cfg --from-literal=a=1 --from-literal=b=two",
        fixture!("configmap.pb"),
        fixture!("configmap.json"),
    ),
    (
        "create secret generic s1 --from-literal=password=p@ss --from-literal=user=admin",
        fixture!("secret.pb"),
        fixture!("secret.json"),
    ),
    ("create serviceaccount bot", fixture!("serviceaccount.pb"), fixture!("serviceaccount.json")),
    ("create job j1 --image=busybox -- echo hi", fixture!("job.pb"), fixture!("job.json")),
    (
        "create cronjob cj --image=busybox --schedule='*/5 * * * *' -- date",
        fixture!("cronjob.pb"),
        fixture!("cronjob.json"),
    ),
    ("create quota q1 --hard=cpu=1,memory=1Gi,pods=10", fixture!("resourcequota.pb"), fixture!("resourcequota.json")),
    ("create service clusterip svc1 --tcp=80:8080", fixture!("service.pb"), fixture!("service.json")),
];

#[test]
fn protobuf_kubectl_bodies_decode_to_kubectl_json() {
    for (command, body, expected) in KUBECTL_PAIRS {
        let expected: Value = serde_json::from_slice(expected).expect("fixture JSON");
        let got = decode(body).unwrap_or_else(|e| panic!("kubectl {command}: {e}"));
        assert_eq!(got, expected, "kubectl {command}");
    }
}

#[test]
fn protobuf_kubectl_namespace_and_deployment_spot_checks() {
    let ns = decode(fixture!("namespace.pb")).unwrap();
    assert_eq!(
        ns,
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "foo", "creationTimestamp": null},
               "spec": {}, "status": {}})
    );
    let deploy = decode(fixture!("deployment.pb")).unwrap();
    assert_eq!(deploy["spec"]["replicas"], 2);
    assert_eq!(deploy["spec"]["selector"], json!({"matchLabels": {"app": "web"}}));
    assert_eq!(deploy["spec"]["strategy"], json!({}));
    assert_eq!(
        deploy["spec"]["template"]["spec"]["containers"],
        json!([{"name": "nginx", "image": "nginx", "ports": [{"containerPort": 80}], "resources": {}}])
    );
    // A pointer set to zero is kept: `--replicas=0` must not become the default of 1.
    assert_eq!(decode(fixture!("deployment-zero-replicas.pb")).unwrap()["spec"]["replicas"], 0);
}

#[test]
fn protobuf_kubectl_auth_can_i_and_whoami() {
    // kubectl auth can-i create pods -n default
    assert_eq!(
        decode(fixture!("selfsubjectaccessreview.pb")).unwrap(),
        json!({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "metadata": {"creationTimestamp": null},
            "spec": {"resourceAttributes": {"namespace": "default", "verb": "create", "resource": "pods"}},
            "status": {"allowed": false},
        })
    );
    // kubectl auth whoami
    assert_eq!(
        decode(fixture!("selfsubjectreview.pb")).unwrap(),
        json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "SelfSubjectReview",
            "metadata": {"creationTimestamp": null},
            "status": {"userInfo": {}},
        })
    );
    assert_eq!(
        type_meta(fixture!("selfsubjectaccessreview.pb")).unwrap(),
        ("authorization.k8s.io/v1".to_string(), "SelfSubjectAccessReview".to_string())
    );
}

// ---- A minimal protobuf writer, independent of the decoder under test. ----

fn varint(mut v: u64, out: &mut Vec<u8>) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// Field `n` as a varint.
fn int(n: u32, v: i64) -> Vec<u8> {
    let mut out = Vec::new();
    varint(u64::from(n) << 3, &mut out);
    varint(v as u64, &mut out);
    out
}

/// Field `n` as length-delimited bytes.
fn bytes(n: u32, b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    varint(u64::from(n) << 3 | 2, &mut out);
    varint(b.len() as u64, &mut out);
    out.extend_from_slice(b);
    out
}

fn string(n: u32, s: &str) -> Vec<u8> {
    bytes(n, s.as_bytes())
}

/// Field `n` as an embedded message made of `parts`.
fn msg(n: u32, parts: &[Vec<u8>]) -> Vec<u8> {
    bytes(n, &parts.concat())
}

/// A map entry of field `n`: key 1, value 2 (already encoded).
fn entry(n: u32, key: &str, value: Vec<u8>) -> Vec<u8> {
    msg(n, &[string(1, key), value])
}

/// `k8s\0` + runtime.Unknown{typeMeta, raw, contentEncoding "", contentType ""}, as client-go writes it.
fn body(api_version: &str, kind: &str, object: &[Vec<u8>]) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend(msg(1, &[string(1, api_version), string(2, kind)]));
    out.extend(bytes(2, &object.concat()));
    out.extend(string(3, ""));
    out.extend(string(4, ""));
    out
}

/// ObjectMeta with every non-pointer scalar written, as Go does.
fn object_meta(name: &str, namespace: &str, extra: &[Vec<u8>]) -> Vec<u8> {
    let mut parts = vec![
        string(1, name),
        string(2, ""),
        string(3, namespace),
        string(4, ""),
        string(5, ""),
        string(6, ""),
        int(7, 0),
        msg(8, &[]),
    ];
    parts.extend_from_slice(extra);
    msg(1, &parts)
}

fn quantity(n: u32, s: &str) -> Vec<u8> {
    msg(n, &[string(1, s)])
}

#[test]
fn protobuf_pod_with_probes_resources_env_and_wrappers() {
    // Container{name 1, image 2, command 3, ports 6, env 7, resources 8, livenessProbe 10,
    // readinessProbe 11, imagePullPolicy 14, securityContext 15}
    let http_get = msg(
        2,
        &[string(1, "/healthz"), msg(2, &[int(1, 1), int(2, 0), string(3, "http")]), string(3, ""), string(4, "")],
    );
    let liveness = msg(10, &[msg(1, &[http_get]), int(2, 5), int(3, 1), int(4, 10), int(5, 1), int(6, 3)]);
    let tcp = msg(3, &[msg(1, &[int(1, 0), int(2, 8080), string(3, "")]), string(2, "")]);
    let readiness = msg(11, &[msg(1, &[tcp]), int(2, 0), int(3, 0), int(4, 0), int(5, 0), int(6, 0)]);
    let resources = msg(
        8,
        &[
            entry(1, "cpu", quantity(2, "500m")),
            entry(1, "memory", quantity(2, "128Mi")),
            entry(2, "cpu", quantity(2, "100m")),
        ],
    );
    // EnvVar{name 1, value 2, valueFrom 3{fieldRef 1{apiVersion 1, fieldPath 2}, secretKeyRef 4{localObjectReference 1{name 1}, key 2, optional 3}}}
    let env = [
        msg(7, &[string(1, "MODE"), string(2, "prod")]),
        msg(7, &[string(1, "POD_IP"), string(2, ""), msg(3, &[msg(1, &[string(1, "v1"), string(2, "status.podIP")])])]),
        msg(
            7,
            &[
                string(1, "PASSWORD"),
                string(2, ""),
                msg(3, &[msg(4, &[msg(1, &[string(1, "creds")]), string(2, "pw"), int(3, 0)])]),
            ],
        ),
    ];
    // SecurityContext{runAsNonRoot 5, allowPrivilegeEscalation 7}: Go pointers, so `false` is kept
    let security = msg(15, &[int(5, 0), int(7, 0)]);
    let mut container = vec![
        string(1, "app"),
        string(2, "nginx:1.27"),
        string(3, "nginx"),
        msg(6, &[string(1, "http"), int(2, 0), int(3, 80), string(4, "TCP"), string(5, "")]),
        resources,
        liveness,
        readiness,
        string(14, "IfNotPresent"),
        security,
    ];
    container.extend(env);
    let object = [
        object_meta("web-0", "default", &[]),
        // PodSpec{volumes 1, containers 2, restartPolicy 3, terminationGracePeriodSeconds 4, nodeSelector 7}
        msg(
            2,
            &[
                msg(1, &[string(1, "data"), msg(2, &[msg(2, &[string(1, "Memory"), quantity(2, "1Gi")])])]),
                msg(2, &container),
                string(3, "Always"),
                int(4, 30),
                entry(7, "disk", string(2, "ssd")),
            ],
        ),
        // PodStatus{phase 1, startTime 7}
        msg(3, &[string(1, "Pending"), msg(7, &[int(1, 1_700_000_000)])]),
    ];
    let got = decode(&body("v1", "Pod", &object)).unwrap();
    assert_eq!(
        got,
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web-0", "namespace": "default", "creationTimestamp": null},
            "spec": {
                "volumes": [{"name": "data", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}],
                "containers": [{
                    "name": "app",
                    "image": "nginx:1.27",
                    "command": ["nginx"],
                    "ports": [{"name": "http", "containerPort": 80, "protocol": "TCP"}],
                    "env": [
                        {"name": "MODE", "value": "prod"},
                        {"name": "POD_IP", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}},
                        {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "pw", "optional": false}}},
                    ],
                    "resources": {"limits": {"cpu": "500m", "memory": "128Mi"}, "requests": {"cpu": "100m"}},
                    "livenessProbe": {
                        "httpGet": {"path": "/healthz", "port": "http"},
                        "initialDelaySeconds": 5,
                        "timeoutSeconds": 1,
                        "periodSeconds": 10,
                        "successThreshold": 1,
                        "failureThreshold": 3,
                    },
                    "readinessProbe": {"tcpSocket": {"port": 8080}},
                    "imagePullPolicy": "IfNotPresent",
                    "securityContext": {"runAsNonRoot": false, "allowPrivilegeEscalation": false},
                }],
                "restartPolicy": "Always",
                "terminationGracePeriodSeconds": 30,
                "nodeSelector": {"disk": "ssd"},
            },
            "status": {"phase": "Pending", "startTime": "2023-11-14T22:13:20Z"},
        })
    );
}

#[test]
fn protobuf_secret_bytes_are_base64_and_times_are_rfc3339() {
    let deletion = msg(9, &[int(1, 0)]); // Unix epoch, not the zero time
    let body = body(
        "v1",
        "Secret",
        &[
            object_meta("tls", "prod", &[deletion, entry(12, "note", string(2, "x"))]),
            entry(2, "key", bytes(2, &[0, 0xff, 0xfe, b'a'])),
            entry(2, "empty", bytes(2, b"")),
            string(3, "Opaque"),
            entry(4, "plain", string(2, "text")),
            int(5, 1),
        ],
    );
    let got = decode(&body).unwrap();
    assert_eq!(got["data"], json!({"key": "AP/+YQ==", "empty": ""}));
    assert_eq!(got["stringData"], json!({"plain": "text"}));
    assert_eq!(got["type"], "Opaque");
    assert_eq!(got["immutable"], true);
    assert_eq!(got["metadata"]["deletionTimestamp"], "1970-01-01T00:00:00Z");
    assert_eq!(got["metadata"]["annotations"], json!({"note": "x"}));
}

#[test]
fn protobuf_lease_micro_time_and_service_int_or_string() {
    // LeaseSpec{holderIdentity 1, leaseDurationSeconds 2, acquireTime 3, renewTime 4}
    let got = decode(&body(
        "coordination.k8s.io/v1",
        "Lease",
        &[
            object_meta("leader", "kube-system", &[]),
            msg(
                2,
                &[string(1, "node-a"), int(2, 15), msg(3, &[]), msg(4, &[int(1, 1_700_000_000), int(2, 123_456_789)])],
            ),
        ],
    ))
    .unwrap();
    assert_eq!(
        got["spec"],
        json!({"holderIdentity": "node-a", "leaseDurationSeconds": 15, "acquireTime": null,
               "renewTime": "2023-11-14T22:13:20.123456Z"})
    );

    // ServicePort{name 1, protocol 2, port 3, targetPort 4, nodePort 5}
    let by_number = msg(
        1,
        &[string(1, "a"), string(2, "TCP"), int(3, 80), msg(4, &[int(1, 0), int(2, 8080), string(3, "")]), int(5, 0)],
    );
    let by_name =
        msg(1, &[string(1, "b"), string(2, "TCP"), int(3, 81), msg(4, &[int(1, 1), int(2, 0), string(3, "web")])]);
    let got = decode(&body(
        "v1",
        "Service",
        &[object_meta("svc", "", &[]), msg(2, &[by_number, by_name, string(4, "ClusterIP")])],
    ))
    .unwrap();
    assert_eq!(
        got["spec"],
        json!({"ports": [{"name": "a", "protocol": "TCP", "port": 80, "targetPort": 8080},
                         {"name": "b", "protocol": "TCP", "port": 81, "targetPort": "web"}],
               "type": "ClusterIP"})
    );
}

#[test]
fn protobuf_subject_access_review_extra_unwraps_and_raw_extension_embeds() {
    // SelfSubjectAccessReviewSpec{resourceAttributes 1{namespace 1, verb 2, group 3, version 4, resource 5}}
    let got = decode(&body(
        "authorization.k8s.io/v1",
        "SelfSubjectAccessReview",
        &[
            object_meta("", "", &[]),
            msg(
                2,
                &[msg(
                    1,
                    &[string(1, "prod"), string(2, "list"), string(3, "apps"), string(4, ""), string(5, "deployments")],
                )],
            ),
        ],
    ))
    .unwrap();
    assert_eq!(
        got["spec"],
        json!({"resourceAttributes": {"namespace": "prod", "verb": "list", "group": "apps", "resource": "deployments"}})
    );

    // SubjectAccessReview.spec.extra: map<string, ExtraValue{items}> → map of arrays.
    let got = decode(&body(
        "authorization.k8s.io/v1",
        "SubjectAccessReview",
        &[
            object_meta("", "", &[]),
            msg(2, &[string(3, "alice"), entry(5, "scopes", msg(2, &[string(1, "a"), string(1, "b")]))]),
        ],
    ))
    .unwrap();
    assert_eq!(got["spec"], json!({"user": "alice", "extra": {"scopes": ["a", "b"]}}));

    // ControllerRevision.data is a RawExtension holding JSON.
    let got = decode(&body(
        "apps/v1",
        "ControllerRevision",
        &[object_meta("rev", "default", &[]), msg(2, &[bytes(1, br#"{"spec":{"x":1}}"#)]), int(3, 2)],
    ))
    .unwrap();
    assert_eq!(got["data"], json!({"spec": {"x": 1}}));
    assert_eq!(got["revision"], 2);
}

#[test]
fn protobuf_go_duration_matches_go() {
    for (ns, s) in [
        (0, "0s"),
        (1, "1ns"),
        (1_500, "1.5µs"),
        (250_000_000, "250ms"),
        (1_000_000_000, "1s"),
        (1_500_000_000, "1.5s"),
        (90_000_000_000, "1m30s"),
        (3_600_000_000_000, "1h0m0s"),
        (-5_000_000_000, "-5s"),
        (i64::MIN, "-2562047h47m16.854775808s"),
    ] {
        assert_eq!(json::go_duration(ns), s, "{ns}ns");
    }
}

#[test]
fn protobuf_errors_name_the_problem() {
    let ns = fixture!("namespace.pb");
    assert_eq!(decode(&ns[4..]), Err(ProtobufError::MissingMagic));
    assert_eq!(decode(b""), Err(ProtobufError::MissingMagic));
    assert!(matches!(decode(&ns[..ns.len() - 3]), Err(ProtobufError::Envelope(_))));
    assert_eq!(decode(&MAGIC), Err(ProtobufError::MissingTypeMeta));

    let err = decode(&body("example.com/v1", "Widget", &[])).unwrap_err();
    assert_eq!(err, ProtobufError::UnsupportedKind { api_version: "example.com/v1".into(), kind: "Widget".into() });
    assert!(err.to_string().contains("example.com/v1") && err.to_string().contains("Widget"), "{err}");
    for (api_version, kind) in
        [("v1", "Container"), ("v1", "ObjectMeta"), ("v2", "Pod"), ("apps/v1beta1", "Deployment"), ("v1", "Pod.x")]
    {
        assert!(
            matches!(decode(&body(api_version, kind, &[])), Err(ProtobufError::UnsupportedKind { .. })),
            "{api_version} {kind}"
        );
        assert!(!supports(api_version, kind));
    }
    for (api_version, kind) in [
        ("v1", "Namespace"),
        ("v1", "Pod"),
        ("v1", "Service"),
        ("apps/v1", "Deployment"),
        ("batch/v1", "CronJob"),
        ("authorization.k8s.io/v1", "SelfSubjectAccessReview"),
        ("authentication.k8s.io/v1", "SelfSubjectReview"),
        ("autoscaling/v1", "HorizontalPodAutoscaler"),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
    ] {
        assert!(supports(api_version, kind), "{api_version} {kind}");
    }

    assert_eq!(decode(&body("", "Pod", &[])), Err(ProtobufError::MissingTypeMeta));

    // Compressed or foreign payloads.
    let mut gz = MAGIC.to_vec();
    gz.extend(msg(1, &[string(1, "v1"), string(2, "Namespace")]));
    gz.extend(string(3, "gzip"));
    assert!(matches!(decode(&gz), Err(ProtobufError::UnsupportedEncoding { field: "contentEncoding", .. })));

    // The object bytes do not parse as a Namespace.
    let err = decode(&body("v1", "Namespace", &[vec![0x0a, 0x05, 0x01]])).unwrap_err();
    assert!(matches!(&err, ProtobufError::Malformed { kind, .. } if kind == "Namespace"), "{err}");
    // Wrong wire type for a string field.
    let err = decode(&body("v1", "Namespace", &[msg(1, &[int(1, 7)])])).unwrap_err();
    assert!(matches!(err, ProtobufError::Malformed { .. }), "{err}");
    // A time no JSON client could read, and a RawExtension that is not JSON: errors with the field path.
    let err = decode(&body("v1", "Namespace", &[object_meta("x", "", &[msg(9, &[int(1, i64::MAX)])])])).unwrap_err();
    assert!(matches!(&err, ProtobufError::Malformed { path, .. } if path == "metadata.deletionTimestamp"), "{err}");
    let err = decode(&body("apps/v1", "ControllerRevision", &[msg(2, &[bytes(1, b"\x0a\x00")])])).unwrap_err();
    assert!(matches!(&err, ProtobufError::Malformed { path, .. } if path == "data"), "{err}");
}

#[test]
fn protobuf_delete_options_decode_in_any_served_group_version() {
    // What kubectl drain sends with each DELETE: gracePeriodSeconds,
    // preconditions (uid), propagationPolicy and dryRun.
    let options = [int(1, 30), msg(2, &[string(1, "u-1"), string(2, "42")]), string(4, "Foreground"), string(5, "All")];
    for api_version in ["v1", "apps/v1", "meta.k8s.io/v1"] {
        let decoded = decode(&body(api_version, "DeleteOptions", &options)).unwrap();
        assert_eq!(
            decoded,
            json!({
                "apiVersion": api_version, "kind": "DeleteOptions",
                "gracePeriodSeconds": 30,
                "preconditions": {"uid": "u-1", "resourceVersion": "42"},
                "propagationPolicy": "Foreground",
                "dryRun": ["All"],
            }),
            "{api_version}"
        );
    }
    assert!(!supports("example.com/v1", "DeleteOptions"));
}

#[test]
fn protobuf_every_prefix_of_a_real_body_is_handled() {
    for (_, body, _) in KUBECTL_PAIRS {
        for end in 0..body.len() {
            let _ = decode(&body[..end]);
        }
    }
}

#[test]
fn protobuf_deep_nesting_is_an_error_not_a_stack_overflow() {
    // Unknown field 15 as nested groups, and nested unknown length-delimited fields.
    let mut raw = Vec::new();
    for _ in 0..100_000 {
        raw.push((15 << 3) | 3);
    }
    let mut body = MAGIC.to_vec();
    body.extend(msg(1, &[string(1, "v1"), string(2, "Namespace")]));
    body.extend(bytes(2, &raw));
    assert!(decode(&body).is_err());
    let mut envelope = MAGIC.to_vec();
    envelope.extend(&raw);
    assert!(decode(&envelope).is_err());
}

/// The Go-field table covers every field of every vendored k8s.io/api message
/// (except apimachinery's wrapper messages), agrees with the descriptors, and is sorted.
#[test]
fn protobuf_go_field_table_matches_descriptors() {
    let fields = go::all_fields();
    assert!(fields.windows(2).all(|w| (w[0].message, w[0].number) < (w[1].message, w[1].number)));
    let pool = pool().unwrap();
    for f in fields {
        let Some(desc) = pool.get_message_by_name(f.message) else { continue };
        let fd = desc.get_field(f.number).unwrap_or_else(|| panic!("{} has no field {}", f.message, f.number));
        // The JSON name is the proto name except for inlined fields and a few
        // initialisms (`BoundObjectReference.uID` is `uid` in JSON).
        let renamed = [("uID", "uid"), ("aPIGroup", "apiGroup"), ("duration", "Duration")];
        assert!(
            f.has(go::INLINE) || f.json == fd.name() || renamed.contains(&(fd.name(), f.json)),
            "{}.{} is {:?} in JSON",
            f.message,
            fd.name(),
            f.json
        );
    }
    let mut missing = Vec::new();
    for desc in pool.all_messages() {
        // core/v1 List is `type List metav1.List` (no tags of its own; the proto names are right).
        let name = desc.full_name();
        if !name.starts_with("k8s.io.api.")
            || desc.is_map_entry()
            || go::unwraps_items(name)
            || name == "k8s.io.api.core.v1.List"
        {
            continue;
        }
        for fd in desc.fields() {
            if go::field(desc.full_name(), fd.number()).is_none() {
                missing.push(fd.full_name().to_string());
            }
        }
    }
    assert!(missing.is_empty(), "fields without Go metadata: {missing:?}");
}

fn valid_bodies() -> Vec<Vec<u8>> {
    KUBECTL_PAIRS
        .iter()
        .map(|(_, b, _)| b.to_vec())
        .chain([fixture!("selfsubjectaccessreview.pb").to_vec(), fixture!("selfsubjectreview.pb").to_vec()])
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn protobuf_arbitrary_bytes_never_panic(tail in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode(&tail);
        let mut body = MAGIC.to_vec();
        body.extend(&tail);
        let _ = decode(&body);
    }

    #[test]
    fn protobuf_mutated_bodies_never_panic(
        which in 0usize..12,
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..6),
    ) {
        let bodies = valid_bodies();
        let mut body = bodies[which % bodies.len()].clone();
        for (at, byte, op) in edits {
            if body.is_empty() {
                body.push(byte);
                continue;
            }
            let i = at.index(body.len());
            match op {
                0 => body[i] = byte,
                1 => body.insert(i, byte),
                _ => { body.remove(i); }
            }
        }
        if let Ok(v) = decode(&body) {
            prop_assert!(v.is_object());
        }
    }

    #[test]
    fn protobuf_arbitrary_object_bytes_never_panic(
        kind in prop::sample::select(vec![
            ("v1", "Pod"), ("v1", "Secret"), ("apps/v1", "Deployment"), ("apps/v1", "ControllerRevision"),
            ("coordination.k8s.io/v1", "Lease"), ("authorization.k8s.io/v1", "SubjectAccessReview"),
        ]),
        raw in proptest::collection::vec(any::<u8>(), 0..256),
    ) {
        let _ = decode(&body(kind.0, kind.1, &[raw]));
    }
}
