//! Secrets encrypted at rest (`--encryption-provider-config`) on a real
//! master: kubectl reads and watches them as usual, etcdctl on the same
//! key sees only ciphertext, and the keys rotate by restarting with a new
//! configuration and rewriting every Secret.

mod support;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::kubectl::*;
use support::*;

/// 32 and 16 random bytes, base64 (any such key works).
const KEY1: &str = "9n1mC0mJm2y8o6Hq1qYpZk5Q7v3W0cHq3xk0s8LrT1E=";
const KEY2: &str = "u7Bq2c9XhC0v5mQ1rL8wYg==";
const PASSWORD: &str = "correct-horse-battery-staple";
const PASSWORD_B64: &str = "Y29ycmVjdC1ob3JzZS1iYXR0ZXJ5LXN0YXBsZQ==";

fn write_config(path: &Path, keys: &[(&str, &str)], identity: bool) {
    let mut providers = String::from("  - aesgcm:\n      keys:\n");
    for (name, secret) in keys {
        providers += &format!("        - name: {name}\n          secret: {secret}\n");
    }
    if identity {
        providers += "  - identity: {}\n";
    }
    let text = format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n\
         - resources: [secrets]\n  providers:\n{providers}"
    );
    std::fs::write(path, text).unwrap();
}

/// What etcdctl prints as the stored value of `key` (lossy UTF-8).
fn raw(cluster: &Cluster, key: &str) -> String {
    must_succeed(cluster.etcdctl(&cluster.endpoints(), &["get", key, "--print-value-only"]))
}

fn restart(cluster: &mut Cluster) {
    cluster.stop(1);
    cluster.start(1);
}

#[tokio::test(flavor = "multi_thread")]
async fn secrets_are_ciphertext_in_the_store_plain_through_the_api_and_their_keys_rotate() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("encryption.yaml");
    write_config(&config, &[("key1", KEY1)], false);
    let mut cluster = Cluster::spawn_with(1, &["--encryption-provider-config", config.to_str().unwrap()]).await;
    let server = cluster.api(1);
    must_ready(&server).await;

    let literal = format!("--from-literal=password={PASSWORD}");
    assert_eq!(ok(kubectl(&server, &["create", "secret", "generic", "db", &literal])), "secret/db created\n");
    assert_eq!(ok(kubectl(&server, &["create", "configmap", "plain", &literal])), "configmap/plain created\n");

    // The store holds ciphertext for the Secret, the ConfigMap as it was.
    let stored = raw(&cluster, "/registry/secrets/default/db");
    assert!(stored.starts_with("k8s:enc:aesgcm:v1:key1:"), "{stored:?}");
    assert!(!stored.contains(PASSWORD) && !stored.contains(PASSWORD_B64) && !stored.contains("\"db\""), "{stored:?}");
    assert!(raw(&cluster, "/registry/configmaps/default/plain").contains(PASSWORD));

    // The API reads, lists, watches and shows history in the clear.
    let get = |name: &str| kubectl(&server, &["get", "secret", name, "-o", "jsonpath={.data.password}"]);
    assert_eq!(ok(get("db")), PASSWORD_B64);
    let list = ok(kubectl(&server, &["get", "secrets", "-o", "jsonpath={.items[*].metadata.name}"]));
    assert_eq!(list, "db");
    let mut watch = Command::new("curl")
        .args(["-sN", &format!("{}/api/v1/namespaces/default/secrets?watch=1&timeoutSeconds=5", server.url())])
        .args(server.curl_flags())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    ok(kubectl(&server, &["label", "secret", "db", "tier=backend"]));
    let mut events = String::new();
    watch.stdout.take().unwrap().read_to_string(&mut events).unwrap();
    watch.wait().unwrap();
    assert!(events.contains("\"ADDED\"") && events.contains("\"MODIFIED\""), "{events}");
    assert_eq!(events.matches(PASSWORD_B64).count(), 2, "both events carry the data: {events}");
    let servers = cluster.endpoints();
    let history = must_succeed(cluster.skiffctl(&servers, &["history", "secret/db", "-n", "default"]));
    assert!(history.contains("ADDED") && history.contains("MODIFIED"), "{history}");

    // Rotation, step 1: key2 becomes the write key, key1 still reads.
    write_config(&config, &[("key2", KEY2), ("key1", KEY1)], false);
    restart(&mut cluster);
    must_ready(&server).await;
    assert_eq!(ok(get("db")), PASSWORD_B64);
    assert!(raw(&cluster, "/registry/secrets/default/db").starts_with("k8s:enc:aesgcm:v1:key1:"));
    // Step 2: rewrite every Secret; an unchanged replace still re-encrypts.
    // (kubectl cannot validate a List against Skiff's OpenAPI documents.)
    let all = ok(kubectl(&server, &["get", "secrets", "-o", "json"]));
    ok(kubectl_stdin(&server, &["replace", "--validate=false", "-f", "-"], &all));
    assert!(raw(&cluster, "/registry/secrets/default/db").starts_with("k8s:enc:aesgcm:v1:key2:"));
    // Step 3: key1 is gone and everything still reads.
    write_config(&config, &[("key2", KEY2)], false);
    restart(&mut cluster);
    must_ready(&server).await;
    assert_eq!(ok(get("db")), PASSWORD_B64);

    // A configuration that lacks the key a Secret was written with says
    // so (500) rather than serving garbage, and loses nothing.
    write_config(&config, &[("key3", KEY1)], true);
    restart(&mut cluster);
    must_ready(&server).await;
    let err = fails(get("db"));
    assert!(err.contains("aesgcm key key2, which is not configured"), "{err}");
    write_config(&config, &[("key2", KEY2)], false);
    restart(&mut cluster);
    must_ready(&server).await;
    assert_eq!(ok(get("db")), PASSWORD_B64);
    let labels = ok(kubectl(&server, &["get", "secret", "db", "-o", "jsonpath={.metadata.labels.tier}"]));
    assert_eq!(labels, "backend");
}
