//! The official Python Kubernetes client (`kubernetes` from PyPI, installed
//! by `make test`) against a real 3-master cluster, through a follower:
//! list, watch from a resourceVersion, create, patch, delete; then a
//! CustomResourceDefinition worked as an operator works one (watch its
//! objects, write their status and scale, delete the definition).

mod support;

use std::process::Command;

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_kubernetes_client_lists_watches_creates_patches_deletes_and_runs_an_operator() {
    let cluster = Cluster::spawn(3).await;
    let leader = cluster.must_leader().await;
    let follower = cluster.members.keys().copied().find(|id| *id != leader).unwrap();
    let api = cluster.api(follower);
    let tls = api.client_cert().map(|c| vec![c.ca.clone(), c.cert.clone(), c.key.clone()]).unwrap_or_default();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/client_check.py");
    let out =
        Command::new("python3").arg(script).arg(api.url()).arg("python").args(tls).output().expect("python3 runs");
    assert!(
        out.status.success(),
        "the Python client check failed:\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
}
