//! The real kubectl 1.32 against a real 3-master cluster, once through a
//! follower and once through the leader: every command a user reaches for
//! first, each with a fresh `--cache-dir`, asserting on kubectl's own output
//! and exit code.

mod support;

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use support::kubectl::*;
use support::*;

fn deployment(ns: &str, image: &str, env: &[(&str, &str)]) -> String {
    let env: Vec<String> = env.iter().map(|(k, v)| format!("{{name: {k}, value: \"{v}\"}}")).collect();
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n  namespace: {ns}\n  labels: {{app: web}}\nspec:\n  \
         replicas: 2\n  selector: {{matchLabels: {{app: web}}}}\n  template:\n    metadata: {{labels: {{app: web}}}}\n    spec:\n      \
         containers:\n      - name: web\n        image: {image}\n        ports: [{{containerPort: 80}}]\n        env: [{}]\n",
        env.join(", ")
    )
}

/// Every command, against `server`, in namespace `ns`.
async fn exercise(server: &Api, ns: &str) {
    must_ready(server).await;
    let out = ok(kubectl(server, &["version"]));
    assert!(out.contains("Server Version: v1.32"), "{out}");
    let out = ok(kubectl(server, &["api-versions"]));
    assert!(out.lines().any(|l| l == "apps/v1") && out.lines().any(|l| l == "v1"), "{out}");
    let out = ok(kubectl(server, &["api-resources"]));
    assert!(out.contains("deployments") && out.contains("deploy") && out.contains("apps/v1"), "{out}");

    // create namespace / configmap / secret / deployment send protobuf bodies.
    assert_eq!(ok(kubectl(server, &["create", "namespace", ns])), format!("namespace/{ns} created\n"));
    let n = ["-n", ns];
    let with = |args: &[&str]| -> Vec<String> { args.iter().chain(n.iter()).map(|s| s.to_string()).collect() };
    let run = |args: Vec<String>| kubectl(server, &args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(ok(run(with(&["create", "configmap", "cfg", "--from-literal=mode=fast"]))), "configmap/cfg created\n");
    assert_eq!(
        ok(run(with(&["create", "secret", "generic", "pw", "--from-literal=pw=s3cret"]))),
        "secret/pw created\n"
    );
    let secret = ok(run(with(&["get", "secret", "pw", "-o", "jsonpath={.data.pw}"])));
    assert_eq!(secret, "czNjcmV0", "base64 of s3cret");
    assert_eq!(
        ok(run(with(&["create", "deployment", "made", "--image=nginx:1.27", "--replicas=2"]))),
        "deployment.apps/made created\n"
    );
    assert_eq!(ok(run(with(&["create", "serviceaccount", "robot"]))), "serviceaccount/robot created\n");
    let out = ok(run(with(&["create", "configmap", "dry", "--from-literal=a=b", "--dry-run=server"])));
    assert_eq!(out, "configmap/dry created (server dry run)\n");
    assert!(fails(run(with(&["get", "configmap", "dry"]))).contains("NotFound"), "a dry run writes nothing");
    assert_eq!(ok(kubectl(server, &["auth", "can-i", "create", "pods", "-n", ns])), "yes\n");

    // create -f, then apply: first, unchanged, changed (strategic merge patch).
    let pod = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: web-1, namespace: {ns}, labels: {{app: web}}}}\nspec:\n  containers:\n  \
         - {{name: web, image: nginx:1.27}}\n"
    );
    assert_eq!(ok(kubectl_stdin(server, &["create", "-f", "-"], &pod)), "pod/web-1 created\n");
    let err = fails(kubectl_stdin(server, &["create", "-f", "-"], &pod));
    assert!(
        err.contains("Error from server (AlreadyExists)") && err.contains("pods \"web-1\" already exists"),
        "{err}"
    );
    let v1 = deployment(ns, "nginx:1.26", &[("MODE", "a"), ("KEEP", "b")]);
    assert_eq!(ok(kubectl_stdin(server, &["apply", "-f", "-"], &v1)), "deployment.apps/web created\n");
    assert_eq!(ok(kubectl_stdin(server, &["apply", "-f", "-"], &v1)), "deployment.apps/web unchanged\n");
    let v2 = deployment(ns, "nginx:1.27", &[("MODE", "a")]);
    assert_eq!(ok(kubectl_stdin(server, &["apply", "-f", "-"], &v2)), "deployment.apps/web configured\n");
    let env =
        ok(run(with(&["get", "deploy", "web", "-o", "jsonpath={.spec.template.spec.containers[0].env[*].name}"])));
    assert_eq!(env, "MODE", "the env var dropped from the manifest is gone");
    let image = ok(run(with(&["get", "deploy", "web", "-o", "jsonpath={.spec.template.spec.containers[0].image}"])));
    assert_eq!(image, "nginx:1.27");
    let unknown = v2.replace("  replicas: 2\n", "  replicas: 2\n  colour: blue\n");
    let err = fails(kubectl_stdin(server, &["apply", "-f", "-"], &unknown));
    assert!(err.contains("unknown field") && err.contains("colour"), "{err}");
    // --validate=warn: applied, the server's warning printed, the field dropped.
    let warned = kubectl_stdin(server, &["apply", "--validate=warn", "-f", "-"], &unknown);
    let stderr = String::from_utf8_lossy(&warned.stderr).into_owned();
    assert_eq!(ok(warned), "deployment.apps/web configured\n");
    assert!(stderr.contains("Warning: unknown field \"spec.colour\""), "{stderr}");

    // get in every output format.
    let out = ok(run(with(&["get", "pods"])));
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "READY", "STATUS", "RESTARTS", "AGE"], "{out}");
    assert!(out.contains("web-1") && out.contains("Pending"), "{out}");
    let out = ok(run(with(&["get", "pods", "-o", "wide"])));
    assert!(out.contains("NODE") && out.contains("NOMINATED NODE"), "{out}");
    let out = ok(run(with(&["get", "pod", "web-1", "-o", "yaml"])));
    assert!(out.contains("kind: Pod") && out.contains("name: web-1") && out.contains("uid:"), "{out}");
    let out = ok(run(with(&["get", "pod", "web-1", "-o", "json"])));
    let pod_json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(pod_json["spec"]["containers"][0]["image"], "nginx:1.27");
    assert_eq!(ok(run(with(&["get", "pods", "-o", "name"]))), "pod/web-1\n");
    assert_eq!(ok(run(with(&["get", "pod", "web-1", "-o", "jsonpath={.metadata.labels.app}"]))), "web");
    assert_eq!(ok(run(with(&["get", "deploy", "-l", "app=web", "-o", "name"]))), "deployment.apps/web\n");
    assert_eq!(ok(run(with(&["get", "pods", "--field-selector", "metadata.name=web-1", "-o", "name"]))), "pod/web-1\n");
    let out = ok(kubectl(server, &["get", "pods", "-A"]));
    assert!(out.starts_with("NAMESPACE") && out.lines().any(|l| l.starts_with(ns) && l.contains("web-1")), "{out}");
    let out = ok(run(with(&["get", "pods", "--show-labels"])));
    assert!(out.contains("LABELS") && out.contains("app=web"), "{out}");
    let empty = run(with(&["get", "jobs"]));
    assert!(empty.status.success());
    assert_eq!(String::from_utf8_lossy(&empty.stderr).trim(), format!("No resources found in {ns} namespace."));
    let err = fails(run(with(&["get", "pod", "nope"])));
    assert_eq!(err.trim(), "Error from server (NotFound): pods \"nope\" not found");
    let err = fails(kubectl(server, &["get", "widgets"]));
    assert!(err.contains("the server doesn't have a resource type \"widgets\""), "{err}");

    // describe
    let out = ok(run(with(&["describe", "pod", "web-1"])));
    assert!(out.contains("Name:") && out.contains("web-1") && out.contains("nginx:1.27"), "{out}");
    let out = ok(run(with(&["describe", "deployment", "web"])));
    assert!(out.contains("Replicas:") && out.contains("StrategyType:"), "{out}");

    // label, annotate, scale, patch (merge, json, strategic)
    assert_eq!(ok(run(with(&["label", "pod", "web-1", "tier=fe"]))), "pod/web-1 labeled\n");
    assert_eq!(ok(run(with(&["annotate", "pod", "web-1", "note=hi"]))), "pod/web-1 annotated\n");
    assert_eq!(
        ok(run(with(&["get", "pod", "web-1", "-o", "jsonpath={.metadata.labels.tier}/{.metadata.annotations.note}"]))),
        "fe/hi"
    );
    assert_eq!(ok(run(with(&["label", "pod", "web-1", "tier-"]))), "pod/web-1 unlabeled\n");
    assert_eq!(ok(run(with(&["scale", "deployment", "web", "--replicas=5"]))), "deployment.apps/web scaled\n");
    assert_eq!(ok(run(with(&["get", "deploy", "web", "-o", "jsonpath={.spec.replicas}"]))), "5");
    ok(run(with(&["patch", "deploy", "web", "--type", "merge", "-p", r#"{"spec":{"replicas":3}}"#])));
    ok(run(with(&[
        "patch",
        "deploy",
        "web",
        "--type",
        "json",
        "-p",
        r#"[{"op":"replace","path":"/spec/replicas","value":4}]"#,
    ])));
    ok(run(with(&[
        "patch",
        "deploy",
        "web",
        "-p",
        r#"{"spec":{"template":{"spec":{"containers":[{"name":"web","image":"nginx:1.28"}]}}}}"#,
    ])));
    let out = ok(run(with(&["get", "deploy", "web", "-o", "jsonpath={.spec.replicas} {.spec.template.spec.containers[0].image} {.spec.template.spec.containers[0].ports[0].containerPort}"])));
    assert_eq!(out, "4 nginx:1.28 80", "the strategic patch merged the container by name");

    // replace with the resourceVersion from a GET; a stale one conflicts.
    let live = ok(run(with(&["get", "configmap", "cfg", "-o", "json"])));
    let mut cm: serde_json::Value = serde_json::from_str(&live).unwrap();
    cm["data"]["mode"] = serde_json::json!("slow");
    assert_eq!(ok(kubectl_stdin(server, &["replace", "-f", "-"], &cm.to_string())), "configmap/cfg replaced\n");
    cm["data"]["mode"] = serde_json::json!("stale");
    let err = fails(kubectl_stdin(server, &["replace", "-f", "-"], &cm.to_string()));
    assert!(err.contains("Error from server (Conflict)"), "{err}");

    // run, get -w, delete (waits for the object to be gone).
    assert_eq!(ok(run(with(&["run", "shell", "--image=busybox", "--restart=Never"]))), "pod/shell created\n");
    let cache = tempfile::tempdir().unwrap();
    let mut watch = server
        .command(cache.path())
        .args(["get", "configmaps", "-w", "-n", ns])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    let header = lines.next().unwrap().unwrap();
    assert!(header.starts_with("NAME"), "{header}");
    assert!(lines.next().unwrap().unwrap().starts_with("cfg"), "the list comes first");
    ok(run(with(&["create", "configmap", "watched", "--from-literal=a=b"])));
    let line = lines.next().unwrap().unwrap();
    assert!(line.starts_with("watched"), "the watch shows the new object: {line}");
    watch.kill().unwrap();
    let _ = watch.wait();
    assert_eq!(ok(run(with(&["delete", "pod", "shell"]))), "pod \"shell\" deleted\n");
    assert_eq!(
        ok(run(with(&["delete", "deployment", "web", "--cascade=background"]))),
        "deployment.apps \"web\" deleted\n"
    );
    let err = fails(run(with(&["get", "deployment", "web"])));
    assert!(err.contains("NotFound"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_works_against_a_follower() {
    let cluster = Cluster::spawn(3).await;
    let leader = cluster.must_leader().await;
    let follower = cluster.members.keys().copied().find(|id| *id != leader).unwrap();
    exercise(&cluster.api(follower), "via-follower").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_works_against_the_leader() {
    let cluster = Cluster::spawn(3).await;
    let leader = cluster.must_leader().await;
    exercise(&cluster.api(leader), "via-leader").await;
}

/// `kubectl explain` reads the served OpenAPI v3 schemas (GVK, field
/// descriptions, types, required fields); `apply --validate=strict` leaves
/// unknown fields to the server, which the v3 documents advertise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_explain_and_strict_validation_read_the_served_schemas() {
    let cluster = Cluster::spawn(1).await;
    let leader = cluster.must_leader().await;
    let server = cluster.api(leader);
    must_ready(&server).await;

    let out = ok(kubectl(&server, &["explain", "pod.spec.containers"]));
    for expected in [
        "KIND:       Pod",
        "VERSION:    v1",
        "FIELD: containers <[]Container>",
        "List of containers belonging to the pod.",
        "A single application container that you want to run within a pod.",
        "FIELDS:",
        "imagePullPolicy\t<string>",
        "-required-",
    ] {
        assert!(out.contains(expected), "{expected:?} missing from:\n{out}");
    }
    let name = out.lines().find(|l| l.trim_start().starts_with("name\t")).unwrap_or_default();
    assert!(name.contains("-required-"), "a container's name is required: {out}");

    let out = ok(kubectl(&server, &["explain", "deployment.spec.strategy"]));
    for expected in [
        "GROUP:      apps",
        "KIND:       Deployment",
        "FIELD: strategy <DeploymentStrategy>",
        "The deployment strategy to use to replace existing pods with new ones.",
        "rollingUpdate\t<RollingUpdateDeployment>",
        "type\t<string>",
    ] {
        assert!(out.contains(expected), "{expected:?} missing from:\n{out}");
    }

    let out = ok(kubectl(&server, &["explain", "service", "--recursive"]));
    for expected in
        ["KIND:       Service", "spec\t<ServiceSpec>", "ports\t<[]ServicePort>", "targetPort\t<IntOrString>"]
    {
        assert!(out.contains(expected), "{expected:?} missing from:\n{out}");
    }
    let err = fails(kubectl(&server, &["explain", "pod.spec.colour"]));
    assert!(err.contains("field \"colour\" does not exist"), "{err}");

    // Strict validation: the v3 PATCH operation carries fieldValidation, so
    // kubectl sends fieldValidation=Strict and the server refuses.
    let pod =
        "apiVersion: v1\nkind: Pod\nmetadata: {name: strict}\nspec:\n  containers:\n  - {name: web, image: nginx}\n";
    let unknown = pod.replace("image: nginx}", "image: nginx, colour: blue}");
    let err = fails(kubectl_stdin(&server, &["apply", "--validate=strict", "-f", "-"], &unknown));
    assert!(err.contains("unknown field") && err.contains("colour"), "{err}");
    assert_eq!(ok(kubectl_stdin(&server, &["apply", "--validate=strict", "-f", "-"], pod)), "pod/strict created\n");
}

/// PodSecurity's `warn` mode as kubectl shows it: the pod is created and
/// kubectl prints the violations; `enforce` refuses the same pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_security_warns_in_warn_mode_and_refuses_in_enforce_mode() {
    let cluster = Cluster::spawn(1).await;
    let leader = cluster.must_leader().await;
    let server = cluster.api(leader);
    must_ready(&server).await;
    ok(kubectl(&server, &["create", "namespace", "relaxed"]));
    ok(kubectl(&server, &["label", "namespace", "relaxed", "pod-security.kubernetes.io/warn=baseline"]));
    let pod = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"host"},
        "spec":{"hostNetwork":true,"containers":[{"name":"c","image":"busybox"}]}}"#;
    let out = kubectl_stdin(&server, &["-n", "relaxed", "create", "-f", "-"], pod);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("Warning: would violate PodSecurity \"baseline:latest\": host namespaces (hostNetwork=true)"),
        "{err}"
    );
    ok(kubectl(&server, &["create", "namespace", "strict"]));
    ok(kubectl(&server, &["label", "namespace", "strict", "pod-security.kubernetes.io/enforce=baseline"]));
    let err = fails(kubectl_stdin(&server, &["-n", "strict", "create", "-f", "-"], pod));
    assert!(err.contains("violates PodSecurity \"baseline:latest\": host namespaces (hostNetwork=true)"), "{err}");
}

/// An eviction through a follower marks the pod (its `DisruptionTarget`
/// condition) on the leader and then deletes it on the version it marked,
/// which the follower may not have applied yet: that is a fresh read, not
/// a Conflict (`kubectl drain` failed on it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evictions_through_a_follower_delete_the_pods_they_marked() {
    let cluster = Cluster::spawn(3).await;
    let leader = cluster.must_leader().await;
    let follower = cluster.members.keys().copied().find(|id| *id != leader).unwrap();
    let api = cluster.api(follower);
    must_ready(&api).await;
    const PODS: usize = 20;
    let pods: Vec<String> = (0..PODS)
        .map(|i| {
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: p{i}, namespace: default}}\nspec:\n  containers: [{{name: a, \
                 image: busybox}}]\n"
            )
        })
        .collect();
    ok(kubectl_stdin(&api, &["apply", "-f", "-"], &pods.join("---\n")));
    for i in 0..PODS {
        let eviction =
            format!("{{\"apiVersion\": \"policy/v1\", \"kind\": \"Eviction\", \"metadata\": {{\"name\": \"p{i}\"}}}}");
        let path = format!("/api/v1/namespaces/default/pods/p{i}/eviction");
        let out = kubectl_stdin(&api, &["create", "--raw", &path, "-f", "-"], &eviction);
        assert!(out.status.success(), "evicting p{i}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let left = ok(kubectl(&api, &["get", "pods", "-o", "name"]));
    assert_eq!(left, "", "every evicted pod is gone");
}
