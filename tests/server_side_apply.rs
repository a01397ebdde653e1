//! The real kubectl 1.32's `apply --server-side` against a real cluster:
//! creation, a no-op re-apply, `--dry-run=server`, a conflict between two
//! field managers as kubectl prints it, `--force-conflicts`, removal of a
//! field the applier stops applying, and `metadata.managedFields` as
//! `kubectl get -o yaml` shows it.

mod support;

use support::kubectl::*;
use support::*;

const NS: &str = "ssa";

fn deployment(labels: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n  namespace: {NS}\n  labels: {{{labels}}}\nspec:\n  \
         replicas: 2\n  selector: {{matchLabels: {{app: web}}}}\n  template:\n    metadata: {{labels: {{app: web}}}}\n    \
         spec:\n      containers:\n      - name: web\n        image: nginx:1.27\n        ports: [{{containerPort: 80}}]\n"
    )
}

/// Only `spec.replicas`: what a second manager (an autoscaler, say) applies.
fn replicas(n: u32) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: web, namespace: {NS}}}\nspec: {{replicas: {n}}}\n"
    )
}

fn jsonpath(server: &Api, what: &str, path: &str) -> String {
    ok(kubectl(server, &["get", what, "-n", NS, "-o", &format!("jsonpath={path}")]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_server_side_apply_tracks_owners_conflicts_and_removals() {
    let cluster = Cluster::spawn(1).await;
    let leader = cluster.must_leader().await;
    let server = &cluster.api(leader);
    must_ready(server).await;
    ok(kubectl(server, &["create", "namespace", NS]));
    let apply = |extra: &[&str], manifest: &str| {
        let args: Vec<&str> = ["apply", "--server-side", "-f", "-"].iter().chain(extra).copied().collect();
        kubectl_stdin(server, &args, manifest)
    };

    // Created by the apply, then applied again without a change.
    let manifest = deployment("app: web, tier: front");
    assert_eq!(ok(apply(&[], &manifest)), "deployment.apps/web serverside-applied\n");
    let created = jsonpath(server, "deploy/web", "{.metadata.resourceVersion}");
    assert_eq!(ok(apply(&[], &manifest)), "deployment.apps/web serverside-applied\n");
    assert_eq!(jsonpath(server, "deploy/web", "{.metadata.resourceVersion}"), created, "a re-apply writes nothing");

    // A server dry run answers but changes nothing.
    let out = ok(apply(&["--dry-run=server"], &deployment("app: web")));
    assert_eq!(out, "deployment.apps/web serverside-applied (server dry run)\n");
    assert_eq!(jsonpath(server, "deploy/web", "{.metadata.labels.tier}"), "front");
    assert_eq!(jsonpath(server, "deploy/web", "{.metadata.resourceVersion}"), created);

    // Another manager changing a field kubectl owns conflicts...
    let err = fails(apply(&["--field-manager=other"], &replicas(3)));
    assert!(
        err.contains("error: Apply failed with 1 conflict: conflict with \"kubectl\": .spec.replicas"),
        "kubectl prints the server's conflict: {err}"
    );
    assert!(err.contains("--force-conflicts"), "{err}");
    assert_eq!(jsonpath(server, "deploy/web", "{.spec.replicas}"), "2");

    // ...unless it forces, which takes the field.
    ok(apply(&["--field-manager=other", "--force-conflicts"], &replicas(3)));
    assert_eq!(jsonpath(server, "deploy/web", "{.spec.replicas}"), "3");

    // kubectl stops applying the tier label (and replicas, now other's):
    // the label goes, the replicas stay.
    let without = deployment("app: web").replace("  replicas: 2\n", "");
    ok(apply(&[], &without));
    assert_eq!(jsonpath(server, "deploy/web", "{.metadata.labels}"), "{\"app\":\"web\"}");
    assert_eq!(jsonpath(server, "deploy/web", "{.spec.replicas}"), "3");

    // A client-side write is recorded too, as an Update.
    ok(kubectl(server, &["label", "deploy/web", "-n", NS, "owner=me"]));
    // kubectl hides managedFields from -o yaml unless asked.
    let plain = ok(kubectl(server, &["get", "deploy/web", "-n", NS, "-o", "yaml"]));
    assert!(!plain.contains("managedFields"), "{plain}");
    let yaml = ok(kubectl(server, &["get", "deploy/web", "-n", NS, "-o", "yaml", "--show-managed-fields"]));
    for line in [
        "managedFields:",
        "manager: kubectl\n",
        "manager: other\n",
        "manager: kubectl-label\n",
        "operation: Apply",
        "operation: Update",
        "fieldsType: FieldsV1",
        "f:replicas: {}",
    ] {
        assert!(yaml.contains(line), "{line:?} missing from:\n{yaml}");
    }
    let managers = ok(kubectl(
        server,
        &[
            "get",
            "deploy/web",
            "-n",
            NS,
            "--show-managed-fields",
            "-o",
            "jsonpath={.metadata.managedFields[*].manager}",
        ],
    ));
    let managers: Vec<&str> = managers.split(' ').collect();
    assert_eq!(managers.len(), 3, "{managers:?}");
    let mut appliers = managers[..2].to_vec();
    appliers.sort();
    assert_eq!(appliers, ["kubectl", "other"], "Apply managers come first");
    assert_eq!(managers[2], "kubectl-label");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_server_side_apply_removes_config_map_keys_it_no_longer_applies() {
    let cluster = Cluster::spawn(1).await;
    let leader = cluster.must_leader().await;
    let server = &cluster.api(leader);
    must_ready(server).await;
    ok(kubectl(server, &["create", "namespace", NS]));
    let cm = |data: &str| {
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: cfg, namespace: {NS}}}\ndata: {{{data}}}\n")
    };
    let apply = |manifest: &str| kubectl_stdin(server, &["apply", "--server-side", "-f", "-"], manifest);
    assert_eq!(ok(apply(&cm("a: '1', b: '2'"))), "configmap/cfg serverside-applied\n");
    assert_eq!(ok(apply(&cm("a: '1'"))), "configmap/cfg serverside-applied\n");
    assert_eq!(jsonpath(server, "cm/cfg", "{.data}"), "{\"a\":\"1\"}");

    // Without a field manager an apply is refused; kubectl always names one, so ask with curl.
    let out = std::process::Command::new("curl")
        .args(["-s", "-X", "PATCH", "-H", "Content-Type: application/apply-patch+yaml", "--data-binary"])
        .arg(cm("a: '1'"))
        .args(server.curl_flags())
        .arg(format!("{}/api/v1/namespaces/{NS}/configmaps/cfg", server.url()))
        .output()
        .expect("curl is installed");
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(body.contains("fieldManager: Required value") && body.contains("\"code\":422"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_moves_client_side_apply_ownership_to_server_side_apply() {
    let cluster = Cluster::spawn(1).await;
    let leader = cluster.must_leader().await;
    let server = &cluster.api(leader);
    must_ready(server).await;
    ok(kubectl(server, &["create", "namespace", NS]));
    let cm = |data: &str| {
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: mig, namespace: {NS}}}\ndata: {{{data}}}\n")
    };
    let managers = || {
        ok(kubectl(
            server,
            &[
                "get",
                "cm/mig",
                "-n",
                NS,
                "--show-managed-fields",
                "-o",
                "jsonpath={.metadata.managedFields[*].manager}",
            ],
        ))
    };

    // A client-side apply records its Update under kubectl's CSA manager.
    assert_eq!(ok(kubectl_stdin(server, &["apply", "-f", "-"], &cm("a: '1', b: '2'"))), "configmap/mig created\n");
    assert_eq!(managers(), "kubectl-client-side-apply");

    // The same configuration applied server-side: kubectl sees the CSA
    // manager and moves its fields to its own Apply entry (a JSON patch of
    // managedFields), as it does against Kubernetes.
    let ssa = |manifest: &str| kubectl_stdin(server, &["apply", "--server-side", "-f", "-"], manifest);
    assert_eq!(ok(ssa(&cm("a: '1', b: '2'"))), "configmap/mig serverside-applied\n");
    assert!(!managers().split(' ').any(|m| m == "kubectl-client-side-apply"), "{}", managers());

    // Now kubectl owns what it applied before: a change is no conflict and
    // a key it stops applying goes.
    assert_eq!(ok(ssa(&cm("a: '9'"))), "configmap/mig serverside-applied\n");
    assert_eq!(jsonpath(server, "cm/mig", "{.data}"), "{\"a\":\"9\"}");
}
