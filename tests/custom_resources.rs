//! CustomResourceDefinitions with the real kubectl 1.32, on a 3-member
//! cluster: a definition created through one member is served by another;
//! its objects are pruned, defaulted and validated by its schema, listed
//! with its printer columns, patched, watched, applied server-side, read
//! through a second version, given a status through the status
//! subresource, scaled through the scale subresource; deleting the
//! definition deletes them.

mod support;

use std::time::{Duration, Instant};

use support::kubectl::*;
use support::*;

const WIDGETS: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, shortNames: [wd]}
  versions:
  - name: v1
    served: true
    storage: true
    subresources:
      status: {}
      scale: {specReplicasPath: .spec.size, statusReplicasPath: .status.count}
    additionalPrinterColumns:
    - {name: Size, type: integer, jsonPath: .spec.size}
    - {name: Colour, type: string, jsonPath: .spec.colour, priority: 1}
    - {name: Age, type: date, jsonPath: .metadata.creationTimestamp}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [size]
            properties:
              size: {type: integer, minimum: 1, maximum: 10}
              colour: {type: string, enum: [red, blue], default: red}
              parts:
                type: array
                x-kubernetes-list-type: map
                x-kubernetes-list-map-keys: [name]
                items:
                  type: object
                  required: [name]
                  properties: {name: {type: string}, count: {type: integer}}
          status:
            type: object
            properties:
              ready: {type: boolean}
              count: {type: integer}
  - name: v1beta1
    served: true
    storage: false
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
"#;

const GADGETS: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: gadgets.example.com}
spec:
  group: example.com
  scope: Cluster
  names: {plural: gadgets, kind: Gadget}
  versions:
  - name: v1alpha1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, properties: {spec: {type: object, x-kubernetes-preserve-unknown-fields: true}}}}
"#;

/// A namespaced `example.com/v1` object of `kind` in `default`.
fn object(kind: &str, name: &str, spec: &str) -> String {
    format!("apiVersion: example.com/v1\nkind: {kind}\nmetadata: {{name: {name}, namespace: default}}\nspec: {spec}\n")
}

fn widget(name: &str, spec: &str) -> String {
    object("Widget", name, spec)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_defines_a_resource_and_uses_it_like_a_built_in_one() {
    let cluster = Cluster::spawn(3).await;
    let leader = cluster.must_leader().await;
    let second = cluster.members.keys().copied().find(|id| *id != leader).unwrap();
    let (a, b) = (cluster.api(leader), cluster.api(second));
    must_ready(&a).await;

    // A broken definition is refused with the reason.
    let broken = WIDGETS.replace("name: widgets.example.com", "name: wodgets.example.com");
    let err = fails(kubectl_stdin(&a, &["apply", "-f", "-"], &broken));
    assert!(err.contains("metadata.name: Invalid value: \"wodgets.example.com\""), "{err}");

    // Defined through one member, established and served through another.
    assert_eq!(
        ok(kubectl_stdin(&a, &["apply", "-f", "-"], WIDGETS)),
        "customresourcedefinition.apiextensions.k8s.io/widgets.example.com created\n"
    );
    ok(kubectl(&b, &["wait", "--for", "condition=Established", "crd/widgets.example.com", "--timeout=20s"]));
    let resources = ok(kubectl(&b, &["api-resources", "--api-group=example.com", "--no-headers"]));
    assert!(resources.contains("widgets") && resources.contains("wd") && resources.contains("Widget"), "{resources}");
    let crds = ok(kubectl(&b, &["get", "crds"]));
    assert!(crds.starts_with("NAME") && crds.contains("CREATED AT") && crds.contains("widgets.example.com"), "{crds}");

    // Fields the schema does not know are refused under kubectl's default
    // strict validation, and pruned without it.
    let shaped = widget("w1", "{size: 3, shape: round}");
    let err = fails(kubectl_stdin(&b, &["apply", "-f", "-"], &shaped));
    assert!(err.contains("unknown field \"spec.shape\""), "{err}");
    assert_eq!(
        ok(kubectl_stdin(&b, &["apply", "--validate=false", "-f", "-"], &shaped)),
        "widget.example.com/w1 created\n"
    );
    let got = ok(kubectl(&b, &["get", "wd", "w1", "-o", "jsonpath={.spec}"]));
    let spec: serde_json::Value = serde_json::from_str(&got).unwrap();
    // Pruned, and defaulted from the schema.
    assert_eq!(spec, serde_json::json!({"size": 3, "colour": "red"}));
    assert_eq!(ok(kubectl(&a, &["get", "widget", "w1", "-o", "jsonpath={.metadata.generation}"])), "1");

    // The schema's rules, as Kubernetes words them.
    let err = fails(kubectl_stdin(&b, &["apply", "-f", "-"], &widget("w2", "{size: 11, colour: green}")));
    assert!(err.contains("spec.size in body should be less than or equal to 10"), "{err}");
    assert!(err.contains("spec.colour: Unsupported value: \"green\""), "{err}");
    let err = fails(kubectl_stdin(&b, &["apply", "-f", "-"], &widget("w2", "{colour: blue}")));
    assert!(err.contains("spec.size: Required value"), "{err}");
    ok(kubectl_stdin(&b, &["apply", "-f", "-"], &widget("w2", "{size: 7, colour: blue}")));

    // The printer columns; Colour only with -o wide.
    let table = ok(kubectl(&a, &["get", "widgets"]));
    let lines: Vec<Vec<&str>> = table.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(lines[0], ["NAME", "SIZE", "AGE"], "{table}");
    assert_eq!(&lines[1][..2], ["w1", "3"], "{table}");
    assert_eq!(&lines[2][..2], ["w2", "7"], "{table}");
    let wide = ok(kubectl(&a, &["get", "widgets", "-o", "wide"]));
    assert!(wide.lines().next().unwrap().split_whitespace().eq(["NAME", "SIZE", "COLOUR", "AGE"]), "{wide}");
    assert!(wide.contains("blue"), "{wide}");

    // Applied again, client-side: kubectl sends a merge patch.
    assert_eq!(
        ok(kubectl_stdin(&a, &["apply", "-f", "-"], &widget("w2", "{size: 8, colour: blue}"))),
        "widget.example.com/w2 configured\n"
    );
    assert_eq!(ok(kubectl(&b, &["get", "widget", "w2", "-o", "jsonpath={.spec.size}"])), "8");

    // kubectl explain reads the schema from the OpenAPI document.
    let explained = ok(kubectl(&b, &["explain", "widgets.spec"]));
    assert!(explained.starts_with("GROUP:      example.com\nKIND:       Widget\nVERSION:    v1\n"), "{explained}");
    assert!(explained.contains("size\t<integer> -required-") && explained.contains("colour\t<string>"), "{explained}");
    let recursive = ok(kubectl(&b, &["explain", "widget", "--recursive"]));
    assert!(recursive.contains("status\t<Object>") && recursive.contains("ready\t<boolean>"), "{recursive}");

    // A merge patch changes the spec (and the generation); custom resources
    // take no strategic merge patch.
    ok(kubectl(&a, &["patch", "widget", "w1", "--type", "merge", "-p", r#"{"spec":{"size":5}}"#]));
    assert_eq!(ok(kubectl(&b, &["get", "widget", "w1", "-o", "jsonpath={.spec.size}/{.metadata.generation}"])), "5/2");
    let err = fails(kubectl(&a, &["patch", "widget", "w1", "-p", r#"{"spec":{"size":6}}"#]));
    assert!(err.contains("unknown format") || err.contains("not supported"), "{err}");

    // The status goes through its subresource only.
    ok(kubectl(
        &a,
        &["patch", "widget", "w1", "--subresource=status", "--type", "merge", "-p", r#"{"status":{"ready":true}}"#],
    ));
    ok(kubectl(&a, &["patch", "widget", "w1", "--type", "merge", "-p", r#"{"status":{"ready":false}}"#]));
    assert_eq!(ok(kubectl(&b, &["get", "widget", "w1", "-o", "jsonpath={.status.ready}"])), "true");

    // Server-side apply records its manager.
    let applied = widget("w1", "{size: 4}");
    ok(kubectl_stdin(&a, &["apply", "--server-side", "--force-conflicts", "-f", "-"], &applied));
    let managers = ok(kubectl(
        &a,
        &["get", "widget", "w1", "--show-managed-fields", "-o", "jsonpath={.metadata.managedFields[*].manager}"],
    ));
    assert!(managers.split_whitespace().any(|m| m == "kubectl"), "{managers}");
    assert_eq!(ok(kubectl(&a, &["get", "widget", "w1", "-o", "jsonpath={.spec.size}"])), "4");

    // The definition's list markers count: `parts` is a list-map on `name`,
    // so a second manager adds its own part without a conflict, and the
    // first dropping its part leaves the other's (an atomic list would have
    // conflicted on `.spec.parts` as a whole).
    let parts = |manager: &str, spec: &str| {
        let args = ["apply", "--server-side", "--field-manager", manager, "-f", "-"];
        kubectl_stdin(&a, &args, &widget("w1", spec))
    };
    ok(parts("kubectl", "{size: 4, parts: [{name: wheel, count: 4}]}"));
    ok(parts("assembler", "{parts: [{name: seat, count: 1}]}"));
    let names = |api: &Api| ok(kubectl(api, &["get", "widget", "w1", "-o", "jsonpath={.spec.parts[*].name}"]));
    assert_eq!(names(&b), "wheel seat");
    ok(parts("kubectl", "{size: 4}"));
    assert_eq!(names(&b), "seat");
    let err = fails(parts("kubectl", "{size: 4, parts: [{name: seat, count: 2}]}"));
    assert!(err.contains("conflict with \"assembler\"") && err.contains(".spec.parts[name=\"seat\"].count"), "{err}");

    // Read through the other served version: only apiVersion differs.
    let other =
        ok(kubectl(&b, &["get", "widgets.v1beta1.example.com", "w1", "-o", "jsonpath={.apiVersion} {.spec.size}"]));
    assert_eq!(other, "example.com/v1beta1 4");

    // The gRPC resource API serves custom objects too, history included,
    // through a follower (the definition's storage version).
    let follower = cluster.members.values().find(|m| m.id != leader).unwrap();
    let grpc = cluster.resource_client(std::slice::from_ref(&follower.client));
    let definition: serde_json::Value =
        serde_json::from_str(&ok(kubectl(&a, &["get", "crd", "widgets.example.com", "-o", "json"]))).unwrap();
    let widgets = skiff_api::custom::resources_of(&definition).into_iter().find(|r| r.version == "v1").unwrap();
    let got = grpc.get(&widgets, "default", "w1").await.expect("a custom object over gRPC");
    assert_eq!(got["spec"]["size"], 4, "{got}");
    let history = grpc.history(&widgets, "default", "w1").await.expect("its history over gRPC");
    assert!(history.entries.len() >= 3, "created, patched, status, applied: {} entries", history.entries.len());
    let listed = grpc.list(&widgets, "default", &Default::default()).await.expect("custom objects listed over gRPC");
    assert_eq!(listed.items.len(), 2);

    // The scale subresource reads and writes the paths the definition
    // names, and the schema still holds.
    ok(kubectl(&a, &["scale", "widget", "w1", "--replicas=7"]));
    assert_eq!(ok(kubectl(&b, &["get", "widget", "w1", "-o", "jsonpath={.spec.size}"])), "7");
    let status = r#"{"status":{"count":6}}"#;
    ok(kubectl(&a, &["patch", "widget", "w1", "--subresource=status", "--type", "merge", "-p", status]));
    let scale: serde_json::Value = serde_json::from_str(&ok(kubectl(
        &b,
        &["get", "--raw", "/apis/example.com/v1/namespaces/default/widgets/w1/scale"],
    )))
    .unwrap();
    assert_eq!((&scale["kind"], &scale["apiVersion"]), (&"Scale".into(), &"autoscaling/v1".into()));
    assert_eq!((scale["spec"]["replicas"].as_i64(), scale["status"]["replicas"].as_i64()), (Some(7), Some(6)));
    let err = fails(kubectl(&a, &["scale", "widget", "w1", "--replicas=11"]));
    assert!(err.contains("spec.size"), "{err}");
    assert_eq!(ok(kubectl(&b, &["get", "widget", "w1", "-o", "jsonpath={.spec.size}"])), "7");

    // A watch from the list's revision sees a change.
    let list: serde_json::Value =
        serde_json::from_str(&ok(kubectl(&a, &["get", "--raw", "/apis/example.com/v1/namespaces/default/widgets"])))
            .unwrap();
    assert_eq!(list["kind"], "WidgetList");
    let listed = list["metadata"]["resourceVersion"].as_str().unwrap().to_string();
    ok(kubectl(&a, &["delete", "widget", "w2"]));
    let watched = ok(kubectl(
        &b,
        &[
            "get",
            "--raw",
            &format!(
                "/apis/example.com/v1/namespaces/default/widgets?watch=true&resourceVersion={listed}&timeoutSeconds=2"
            ),
        ],
    ));
    assert!(watched.contains("\"type\":\"DELETED\"") && watched.contains("\"name\":\"w2\""), "{watched}");

    // A namespace takes its custom resources along. No controller manager
    // runs here: the namespace is finalized by hand, as the namespace
    // controller does once the built-in kinds are gone.
    ok(kubectl(&a, &["create", "namespace", "crs"]));
    ok(kubectl_stdin(
        &a,
        &["apply", "-f", "-"],
        &widget("w9", "{size: 1}").replace("namespace: default", "namespace: crs"),
    ));
    ok(kubectl(&a, &["delete", "namespace", "crs", "--wait=false"]));
    let finalized = r#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"crs"},"spec":{"finalizers":[]}}"#;
    ok(kubectl_stdin(&a, &["replace", "--raw", "/api/v1/namespaces/crs/finalize", "-f", "-"], finalized));
    let deadline = Instant::now() + Duration::from_secs(20);
    while kubectl(&a, &["get", "namespace", "crs"]).status.success() {
        assert!(Instant::now() < deadline, "namespace crs was never removed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ok(kubectl(&a, &["create", "namespace", "crs"]));
    let none = kubectl(&b, &["get", "widgets", "-n", "crs"]);
    assert!(String::from_utf8_lossy(&none.stderr).contains("No resources found"), "{none:?}");

    // A cluster-scoped resource.
    ok(kubectl_stdin(&a, &["apply", "-f", "-"], GADGETS));
    ok(kubectl(&a, &["wait", "--for", "condition=Established", "crd/gadgets.example.com", "--timeout=20s"]));
    let gadget = "apiVersion: example.com/v1alpha1\nkind: Gadget\nmetadata: {name: g1}\nspec: {anything: [1, 2]}\n";
    assert_eq!(ok(kubectl_stdin(&b, &["apply", "-f", "-"], gadget)), "gadget.example.com/g1 created\n");
    assert_eq!(ok(kubectl(&a, &["get", "gadgets", "-o", "name"])), "gadget.example.com/g1\n");
    assert_eq!(ok(kubectl(&a, &["get", "gadget", "g1", "-o", "jsonpath={.spec.anything}"])), "[1,2]");

    // Deleting the definition deletes its objects: defined again, it has none.
    ok(kubectl(&a, &["delete", "crd", "widgets.example.com"]));
    let err = fails(kubectl(&b, &["get", "widgets"]));
    assert!(err.contains("the server doesn't have a resource type \"widgets\""), "{err}");
    ok(kubectl_stdin(&b, &["apply", "-f", "-"], WIDGETS));
    ok(kubectl(&a, &["wait", "--for", "condition=Established", "crd/widgets.example.com", "--timeout=20s"]));
    let none = kubectl(&a, &["get", "widgets"]);
    assert!(String::from_utf8_lossy(&none.stderr).contains("No resources found"), "{none:?}");
    assert_eq!(ok(kubectl(&a, &["get", "gadgets", "-o", "name"])), "gadget.example.com/g1\n", "other resources stay");
}

const SCALERS: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: scalers.example.com}
spec:
  group: example.com
  scope: Namespaced
  names: {plural: scalers, kind: Scaler}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            x-kubernetes-validations:
            - rule: self.replicas <= self.maxReplicas
              messageExpression: "'replicas (' + string(self.replicas) + ') must not exceed maxReplicas'"
            - rule: "!has(self.tier) || self.tier == oldSelf.tier"
              message: tier is immutable
              reason: FieldValueForbidden
              fieldPath: .tier
            properties:
              replicas: {type: integer}
              maxReplicas: {type: integer}
              tier: {type: string, x-kubernetes-validations: [{rule: "self.lowerAscii() == self"}]}
"#;

fn scaler(name: &str, spec: &str) -> String {
    object("Scaler", name, spec)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_meets_the_cel_rules_of_a_definition() {
    let cluster = Cluster::spawn(1).await;
    let leader = cluster.must_leader().await;
    let api = cluster.api(leader);
    must_ready(&api).await;

    // A rule that does not compile, or calls what Skiff lacks, keeps the
    // definition out, with the rule's place in the schema.
    let broken = SCALERS.replace("self.replicas <= self.maxReplicas", "self.replicas <=");
    let err = fails(kubectl_stdin(&api, &["apply", "-f", "-"], &broken));
    assert!(
        err.contains("spec.versions[0].schema.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule")
            && err.contains("compilation failed"),
        "{err}"
    );
    let unsupported = SCALERS.replace("self.lowerAscii() == self", "isURL(self)");
    let err = fails(kubectl_stdin(&api, &["apply", "-f", "-"], &unsupported));
    assert!(err.contains("'isURL' of Kubernetes' CEL libraries is not supported"), "{err}");

    ok(kubectl_stdin(&api, &["apply", "-f", "-"], SCALERS));
    ok(kubectl(&api, &["wait", "--for", "condition=Established", "crd/scalers.example.com", "--timeout=20s"]));

    // Objects are held to the rules, with their messages.
    let err = fails(kubectl_stdin(&api, &["apply", "-f", "-"], &scaler("s1", "{replicas: 5, maxReplicas: 3}")));
    assert!(err.contains("spec: Invalid value: \"object\": replicas (5) must not exceed maxReplicas"), "{err}");
    let err =
        fails(kubectl_stdin(&api, &["apply", "-f", "-"], &scaler("s1", "{replicas: 1, maxReplicas: 3, tier: Gold}")));
    assert!(err.contains("spec.tier: Invalid value: \"string\": failed rule: self.lowerAscii() == self"), "{err}");
    ok(kubectl_stdin(&api, &["apply", "-f", "-"], &scaler("s1", "{replicas: 1, maxReplicas: 3, tier: gold}")));

    // The transition rule compares an update with what is stored.
    ok(kubectl(&api, &["patch", "scaler", "s1", "--type", "merge", "-p", r#"{"spec":{"replicas":3}}"#]));
    let err =
        fails(kubectl(&api, &["patch", "scaler", "s1", "--type", "merge", "-p", r#"{"spec":{"tier":"silver"}}"#]));
    assert!(err.contains("spec.tier: Forbidden: tier is immutable"), "{err}");
    assert_eq!(ok(kubectl(&api, &["get", "scaler", "s1", "-o", "jsonpath={.spec.tier}/{.spec.replicas}"])), "gold/3");
}
