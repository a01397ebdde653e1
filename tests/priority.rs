//! PriorityClasses through the real kubectl against one real master: the
//! system classes exist from the start, a user class is created and
//! listed with kubectl's columns, and a pod's priority is resolved from
//! its class at admission (an unknown class is refused).

mod support;

use std::time::{Duration, Instant};

use support::kubectl::*;
use support::*;

fn pod(name: &str, class: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  priorityClassName: {class}\n  \
         containers:\n  - {{name: web, image: nginx:1.27}}\n"
    )
}

/// Waits until the master has created the default namespace and the
/// system classes.
async fn must_bootstrapped(server: &Api) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let classes = String::from_utf8_lossy(&kubectl(server, &["get", "pc", "-o", "name"]).stdout).into_owned();
        let namespaces =
            String::from_utf8_lossy(&kubectl(server, &["get", "ns", "default", "-o", "name"]).stdout).into_owned();
        if classes.contains("system-cluster-critical") && namespaces.contains("default") {
            return;
        }
        assert!(Instant::now() < deadline, "the system priority classes never appeared: {classes}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_get_the_priority_of_their_class() {
    let cluster = Cluster::spawn(1).await;
    let server = cluster.api(1);
    must_bootstrapped(&server).await;

    assert_eq!(
        ok(kubectl(&server, &["create", "priorityclass", "high", "--value", "1000"])),
        "priorityclass.scheduling.k8s.io/high created\n"
    );
    let table = ok(kubectl(&server, &["get", "pc"]));
    let rows: Vec<Vec<&str>> = table.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows[0], ["NAME", "VALUE", "GLOBAL-DEFAULT", "AGE", "PREEMPTIONPOLICY"], "{table}");
    let row = |name: &str| rows.iter().find(|r| r[0] == name).unwrap_or_else(|| panic!("no {name} in {table}"));
    assert_eq!(row("high")[1..3], ["1000", "false"]);
    assert_eq!(row("high")[4], "PreemptLowerPriority");
    assert_eq!(row("system-cluster-critical")[1], "2000000000");
    assert_eq!(row("system-node-critical")[1], "2000001000");

    assert_eq!(ok(kubectl_stdin(&server, &["create", "-f", "-"], &pod("web", "high"))), "pod/web created\n");
    let priority = ok(kubectl(&server, &["get", "pod", "web", "-o", "jsonpath={.spec.priority}"]));
    assert_eq!(priority, "1000");

    let err = fails(kubectl_stdin(&server, &["create", "-f", "-"], &pod("lost", "foo")));
    assert!(
        err.contains("Error from server (Forbidden)")
            && err.contains("pods \"lost\" is forbidden: no PriorityClass with name foo was found"),
        "{err}"
    );
    let err = fails(kubectl(&server, &["create", "priorityclass", "huge", "--value", "1000000001"]));
    assert!(err.contains("maximum allowed value of a user defined priority is 1000000000"), "{err}");
    let err = fails(kubectl(&server, &["delete", "pc", "system-node-critical"]));
    assert!(err.contains("this is a system priority class and cannot be deleted"), "{err}");

    // The classes are decoded once and kept while none changes: a class
    // deleted, then made again with another value, is read as it is now.
    ok(kubectl(&server, &["delete", "pc", "high"]));
    let err = fails(kubectl_stdin(&server, &["create", "-f", "-"], &pod("gone", "high")));
    assert!(err.contains("no PriorityClass with name high was found"), "{err}");
    ok(kubectl(&server, &["create", "priorityclass", "high", "--value", "500"]));
    ok(kubectl_stdin(&server, &["create", "-f", "-"], &pod("again", "high")));
    let priority = ok(kubectl(&server, &["get", "pod", "again", "-o", "jsonpath={.spec.priority}"]));
    assert_eq!(priority, "500");
}
