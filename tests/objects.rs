//! Kubernetes objects on a real 3-master cluster: `skiffctl` apply, get,
//! delete, history and diff; a resource watch that keeps going through
//! leader kills, resuming from its last resourceVersion on another master;
//! a partitioned master that never answers a write from its stale copy.

mod support;

use std::collections::BTreeSet;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};
use skiff_api::resources::of;
use skiff_api::{meta, Kind, Reason};
use skiff_client::resources::{DeleteParams, EventType, WatchParams};
use skiff_client::Client;
use support::*;

const KINDS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/manifests/kinds.yaml");

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

async fn must_default_namespaces(cluster: &Cluster, servers: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = cluster.skiffctl(servers, &["get", "namespaces"]);
        let text = stdout(&out);
        if ["default", "kube-system", "kube-public", "kube-node-lease"].iter().all(|n| text.contains(n)) {
            return;
        }
        assert!(Instant::now() < deadline, "default namespaces never appeared: {text}{}", stderr(&out));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn write_manifest(dir: &std::path::Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skiffctl_applies_gets_and_deletes_every_kind() {
    let cluster = Cluster::spawn(3).await;
    let servers = cluster.endpoints();
    must_default_namespaces(&cluster, &servers).await;

    let out = must_succeed(cluster.skiffctl(&servers, &["apply", "-f", KINDS]));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 19, "{out}");
    assert!(lines.iter().all(|l| l.ends_with(" created")), "{out}");
    assert!(out.contains("deployment.apps/web created") && out.contains("lease.coordination.k8s.io/scheduler created"));
    let out = must_succeed(cluster.skiffctl(&servers, &["apply", "-f", KINDS]));
    assert!(out.lines().all(|l| l.ends_with(" unchanged")), "a second apply changes nothing: {out}");

    // Client-side apply: a changed manifest configures, a dropped key is removed.
    let dir = tempfile::tempdir().unwrap();
    let changed = write_manifest(
        dir.path(),
        "cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings, namespace: crud}\ndata: {level: high}\n",
    );
    assert_eq!(must_succeed(cluster.skiffctl(&servers, &["apply", "-f", &changed])), "configmap/settings configured\n");
    let cm: Value = serde_json::from_str(&must_succeed(
        cluster.skiffctl(&servers, &["get", "configmap", "settings", "-n", "crud", "-o", "json"]),
    ))
    .unwrap();
    assert_eq!(cm["data"], json!({"level": "high"}));

    let out = must_succeed(cluster.skiffctl(&servers, &["get", "pods", "-n", "crud"]));
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "READY", "STATUS", "RESTARTS", "AGE"], "{out}");
    assert!(out.lines().nth(1).unwrap().starts_with("web-1 "), "{out}");
    assert!(out.contains("0/1") && out.contains("Pending"), "{out}");
    let out = must_succeed(cluster.skiffctl(&servers, &["get", "deploy", "-n", "crud", "-o", "wide"]));
    assert!(out.contains("CONTAINERS") && out.contains("nginx:1.27") && out.contains("0/3"), "{out}");
    let out = must_succeed(cluster.skiffctl(&servers, &["get", "svc", "-A"]));
    assert!(out.starts_with("NAMESPACE"), "{out}");
    assert!(out.contains("crud") && out.contains("10."), "cluster IP shown: {out}");
    let out = must_succeed(cluster.skiffctl(&servers, &["get", "pods", "-n", "crud", "-l", "app=web", "-o", "name"]));
    assert_eq!(out, "pod/web-1\n");
    let out = must_succeed(cluster.skiffctl(&servers, &["get", "pod/web-1", "-n", "crud", "-o", "yaml"]));
    assert!(out.contains("name: web-1") && out.contains("resourceVersion:"), "{out}");
    let out = cluster.skiffctl(&servers, &["get", "pods", "-n", "crud", "--field-selector", "spec.nodeName=nowhere"]);
    assert!(out.status.success());
    assert_eq!(stderr(&out).trim(), "No resources found in crud namespace.");

    // Errors read as Kubernetes users know them.
    let out = cluster.skiffctl(&servers, &["get", "pod", "nope", "-n", "crud"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("Error from server (NotFound): pods \"nope\" not found"), "{}", stderr(&out));
    let out = cluster.skiffctl(&servers, &["get", "widgets"]);
    assert!(stderr(&out).contains("the server doesn't have a resource type \"widgets\""), "{}", stderr(&out));
    let bad = write_manifest(
        dir.path(),
        "bad.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: Bad_Name, namespace: crud}\nspec: {containers: [{name: c}]}\n",
    );
    let out = cluster.skiffctl(&servers, &["apply", "-f", &bad]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("Error from server (Invalid)") && err.contains("metadata.name"), "{err}");
    assert!(err.contains("spec.containers[0].image: Required value"), "{err}");

    // Delete everything but the namespace (its controller finalizes it).
    let without_ns: String = std::fs::read_to_string(KINDS)
        .unwrap()
        .split("\n---\n")
        .filter(|doc| !doc.contains("kind: Namespace"))
        .collect::<Vec<_>>()
        .join("\n---\n");
    let rest = write_manifest(dir.path(), "rest.yaml", &without_ns);
    let out = must_succeed(cluster.skiffctl(&servers, &["delete", "-f", &rest]));
    assert_eq!(out.lines().count(), 18, "{out}");
    assert!(out.contains("pod \"web-1\" deleted"), "{out}");
    let out = cluster.skiffctl(&servers, &["get", "pods", "-n", "crud"]);
    assert_eq!(stderr(&out).trim(), "No resources found in crud namespace.");
    let out = cluster.skiffctl(&servers, &["delete", "pod", "web-1", "-n", "crud"]);
    assert!(stderr(&out).contains("NotFound"), "{}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_get_at_revision_and_diff_span_a_leader_change() {
    let mut cluster = Cluster::spawn(3).await;
    let servers = cluster.endpoints();
    must_default_namespaces(&cluster, &servers).await;
    let dir = tempfile::tempdir().unwrap();
    let deployment = |image: &str, replicas: u32| {
        format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: web, namespace: default}}\nspec:\n  replicas: {replicas}\n  \
             selector: {{matchLabels: {{app: web}}}}\n  template:\n    metadata: {{labels: {{app: web}}}}\n    spec:\n      \
             containers: [{{name: web, image: \"{image}\"}}]\n"
        )
    };
    for (i, (image, replicas)) in [("nginx:1.25", 1), ("nginx:1.26", 1)].iter().enumerate() {
        let f = write_manifest(dir.path(), &format!("d{i}.yaml"), &deployment(image, *replicas));
        must_succeed(cluster.skiffctl(&servers, &["apply", "-f", &f]));
    }
    let leader = cluster.must_leader().await;
    cluster.kill(leader);
    cluster.must_leader().await;
    let servers = cluster.endpoints();
    let f = write_manifest(dir.path(), "d2.yaml", &deployment("nginx:1.26", 4));
    must_succeed(cluster.skiffctl(&servers, &["apply", "-f", &f]));

    let out = must_succeed(cluster.skiffctl(&servers, &["history", "deploy/web"]));
    let rows: Vec<&str> = out.lines().skip(1).collect();
    assert_eq!(rows.len(), 3, "{out}");
    assert!(out.lines().next().unwrap().starts_with("REVISION"), "{out}");
    assert!(rows[0].contains("ADDED") && rows[0].contains("created"), "{out}");
    assert!(rows[1].contains("MODIFIED") && rows[1].contains("nginx:1.25 -> nginx:1.26"), "{out}");
    assert!(rows[2].contains("spec.replicas: 1 -> 4"), "{out}");
    let revisions: Vec<String> = rows.iter().map(|r| r.split_whitespace().next().unwrap().to_string()).collect();

    let first: Value = serde_json::from_str(&must_succeed(
        cluster.skiffctl(&servers, &["get", "deploy", "web", "--revision", &revisions[0], "-o", "json"]),
    ))
    .unwrap();
    assert_eq!(first["spec"]["template"]["spec"]["containers"][0]["image"], "nginx:1.25");
    assert_eq!(first["metadata"]["resourceVersion"], revisions[0].as_str());
    let out = must_succeed(
        cluster.skiffctl(&servers, &["diff", "deploy", "web", "--from", &revisions[0], "--to", &revisions[2]]),
    );
    assert!(out.contains("\n-      - image: nginx:1.25\n+      - image: nginx:1.26\n"), "{out}");
    assert!(out.contains("-  replicas: 1") && out.contains("+  replicas: 4"), "{out}");
}

/// Reads a watch from `client`, reconnecting from the last resourceVersion
/// whenever the stream breaks, until `stop`; returns every event seen.
async fn follow(client: Client, namespace: &str, stop: Arc<AtomicBool>, seen: Arc<Mutex<Vec<(String, i64)>>>) {
    let cms = of(Kind::ConfigMap);
    let mut params = WatchParams { resource_version: "0".into(), allow_bookmarks: true, ..Default::default() };
    while !stop.load(Ordering::Relaxed) {
        let mut stream = match client.watch(cms, namespace, &params).await {
            Ok(s) => Box::pin(s),
            Err(e) => {
                assert!(!e.is(Reason::Expired), "history was never compacted");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        loop {
            let next = tokio::time::timeout(Duration::from_millis(500), stream.next()).await;
            let event = match next {
                Err(_) if stop.load(Ordering::Relaxed) => return,
                Err(_) => continue,
                Ok(Some(Ok(e))) => e,
                Ok(_) => break,
            };
            let rv: i64 = event.resource_version().unwrap_or("0").parse().unwrap();
            params.resource_version = rv.to_string();
            if event.kind == EventType::Error {
                break;
            }
            if event.kind != EventType::Bookmark {
                seen.lock().unwrap().push((event.kind.as_str().to_string(), rv));
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_on_a_follower_misses_nothing_and_repeats_nothing_across_leader_kills() {
    let mut cluster = Cluster::spawn(3).await;
    let all = cluster.endpoints();
    must_default_namespaces(&cluster, &all).await;
    let writer = cluster.client();
    writer
        .create(of(Kind::Namespace), "", &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "w"}}))
        .await
        .unwrap();

    let leader = cluster.must_leader().await;
    let follower = *cluster.members.keys().find(|id| **id != leader).unwrap();
    let other = *cluster.members.keys().find(|id| **id != leader && **id != follower).unwrap();
    // The watch starts on a follower and may fail over to the third member.
    let watch_client =
        cluster.resource_client(&[cluster.members[&follower].client.clone(), cluster.members[&other].client.clone()]);
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let watcher = tokio::spawn(follow(watch_client, "w", stop.clone(), seen.clone()));

    // Writers record the revision of every acknowledged write.
    let acked = Arc::new(Mutex::new(BTreeSet::new()));
    let writing = Arc::new(AtomicBool::new(true));
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let (client, acked, writing) = (writer.clone(), acked.clone(), writing.clone());
            tokio::spawn(async move {
                let cms = of(Kind::ConfigMap);
                let mut i = 0;
                while writing.load(Ordering::Relaxed) {
                    let name = format!("w{w}-{}", i % 5);
                    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": name, "namespace": "w"}, "data": {"i": i.to_string()}});
                    let result = match client.get(cms, "w", &name).await {
                        Ok(mut live) => {
                            live["data"] = cm["data"].clone();
                            client.update(cms, &live).await
                        }
                        Err(_) => client.create(cms, "w", &cm).await,
                    };
                    if let Ok(obj) = result {
                        acked.lock().unwrap().insert(meta::resource_version(&obj).unwrap().parse::<i64>().unwrap());
                    }
                    i += 1;
                    if i % 40 == 0 {
                        let _ = client.delete(cms, "w", &name, &DeleteParams::default()).await;
                    }
                }
            })
        })
        .collect();

    tokio::time::sleep(Duration::from_secs(2)).await;
    // Kill the leader; the followers elect a new one, the watch goes on.
    cluster.kill(leader);
    cluster.must_leader().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.start(leader);
    cluster.must_leader().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Kill the watch's own master: it resumes on the other one from its last revision.
    cluster.kill(follower);
    cluster.must_leader().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    writing.store(false, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    let last = *acked.lock().unwrap().iter().next_back().expect("writes were acknowledged");
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen.lock().unwrap().last().map(|(_, rv)| *rv).unwrap_or(0) < last {
        assert!(Instant::now() < deadline, "the watch never caught up to revision {last}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    watcher.await.unwrap();

    let seen = seen.lock().unwrap().clone();
    let revisions: Vec<i64> = seen.iter().map(|(_, rv)| *rv).collect();
    assert!(revisions.windows(2).all(|w| w[0] < w[1]), "events in order, none twice");
    let seen_set: BTreeSet<i64> = revisions.iter().copied().collect();
    let acked = acked.lock().unwrap().clone();
    let missing: Vec<&i64> = acked.difference(&seen_set).collect();
    assert!(missing.is_empty(), "acknowledged writes missing from the watch: {missing:?}");
    assert!(acked.len() > 50, "enough writes to mean something: {}", acked.len());
}

/// PATCHes `body` onto ConfigMap `default/cm` from inside member `id`'s
/// network namespace (the only place a partitioned member can be reached
/// from); returns the HTTP status and the body.
fn patch_from_inside(net: &support::netns::Network, cluster: &Cluster, id: u64, body: &str) -> (u16, String) {
    let path = "/api/v1/namespaces/default/configmaps/cm";
    status_of(curl_from_inside(net, cluster, id, "PATCH", path, "application/merge-patch+json", body))
}

/// curl sending `method` to `path` with `body`, from inside member `id`'s
/// network namespace (the only way to reach it while it is cut off).
fn curl_from_inside(
    net: &support::netns::Network,
    cluster: &Cluster,
    id: u64,
    method: &str,
    path: &str,
    content_type: &str,
    body: &str,
) -> std::process::Child {
    let api = cluster.api(id);
    Command::new("ip")
        .args(["netns", "exec", net.namespace(id), "curl", "-sS", "--max-time", "40", "-X", method])
        .args(api.curl_flags())
        .args(["-H", &format!("Content-Type: {content_type}"), "--data", body, "-w", "\n%{http_code}"])
        .arg(format!("{}{path}", api.url()))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("curl is installed (make deps)")
}

/// The status and body curl got, once it ends.
fn status_of(child: std::process::Child) -> (u16, String) {
    let out = child.wait_with_output().expect("curl ran");
    let text = stdout(&out);
    let (body, code) = text.rsplit_once('\n').unwrap_or_else(|| panic!("curl: {text}{}", stderr(&out)));
    (code.parse().unwrap_or_else(|_| panic!("curl: {text}{}", stderr(&out))), body.to_string())
}

/// A member cut off from the leader holds an old copy of an object. A patch
/// through it that would turn the object back into that old copy must not
/// be answered "done, nothing to change" from the stale copy: that answer
/// would be a lost update (the newer value stays, the client believes its
/// own is in). It needs a current read, which a cut-off member cannot make.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_patch_through_a_partitioned_member_is_never_answered_from_its_stale_copy() {
    let net = support::netns::Network::create(&[1, 2, 3]).expect("network namespaces (run as root with iproute2)");
    let cluster = Cluster::spawn_in(&net, 3, &[]).await;
    let leader = cluster.must_leader().await;
    let stale = *cluster.members.keys().find(|id| **id != leader).unwrap();
    let cms = of(Kind::ConfigMap);
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "cm", "namespace": "default", "labels": {"v": "a"}}});
    let writer = cluster.resource_client(&[&cluster.members[&leader].client]);
    writer.create(cms, "default", &cm).await.unwrap();
    // A linearizable read through the member: it has applied v=a.
    let via_stale = cluster.resource_client(&[&cluster.members[&stale].client]);
    assert_eq!(via_stale.get(cms, "default", "cm").await.unwrap()["metadata"]["labels"]["v"], "a");

    net.split(&[stale]).unwrap();
    let mut live = writer.get(cms, "default", "cm").await.unwrap();
    live["metadata"]["labels"]["v"] = json!("b");
    writer.update(cms, &live).await.unwrap();

    let (code, body) = patch_from_inside(&net, &cluster, stale, r#"{"metadata":{"labels":{"v":"a"}}}"#);
    assert!(!(200..300).contains(&code), "a cut-off member answered the patch from its stale copy: {code} {body}");
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["kind"], "Status", "{body}");
    assert_eq!(writer.get(cms, "default", "cm").await.unwrap()["metadata"]["labels"]["v"], "b");

    // Healed, the same patch through the same member is written.
    net.heal().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, body) = patch_from_inside(&net, &cluster, stale, r#"{"metadata":{"labels":{"v":"a"}}}"#);
        if code == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the healed member never took the patch: {code} {body}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(writer.get(cms, "default", "cm").await.unwrap()["metadata"]["labels"]["v"], "a");
}

/// `DELETE` of ConfigMap `name` with `body`, from inside member `id`'s namespace.
fn delete_from_inside(
    net: &support::netns::Network,
    cluster: &Cluster,
    id: u64,
    name: &str,
    body: &str,
) -> std::process::Child {
    let path = format!("/api/v1/namespaces/default/configmaps/{name}");
    curl_from_inside(net, cluster, id, "DELETE", &path, "application/json", body)
}

/// A delete whose resourceVersion precondition names a version written
/// through the leader, sent to a member that has not applied it (it is
/// cut off), is judged on a current read once the member can make one,
/// not refused at once from the member's older copy (which is what a
/// member without the second read does, every time). A precondition
/// naming a version the object no longer has is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_precondition_through_a_trailing_member_is_checked_on_a_current_read() {
    let net = support::netns::Network::create(&[1, 2, 3]).expect("network namespaces (run as root with iproute2)");
    let cluster = Cluster::spawn_in(&net, 3, &[]).await;
    let leader = cluster.must_leader().await;
    let trailing = *cluster.members.keys().find(|id| **id != leader).unwrap();
    let cms = of(Kind::ConfigMap);
    let writer = cluster.resource_client(&[&cluster.members[&leader].client]);
    let via_trailing = cluster.resource_client(&[&cluster.members[&trailing].client]);
    for name in ["old", "new"] {
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"}});
        writer.create(cms, "default", &cm).await.unwrap();
        via_trailing.get(cms, "default", name).await.unwrap();
    }

    net.split(&[trailing]).unwrap();
    let mut versions = std::collections::HashMap::new();
    for name in ["old", "new"] {
        let mut live = writer.get(cms, "default", name).await.unwrap();
        live["data"] = json!({"k": "v"});
        let updated = writer.update(cms, &live).await.unwrap();
        let before = live["metadata"]["resourceVersion"].as_str().unwrap().to_string();
        versions.insert(name, (before, updated["metadata"]["resourceVersion"].as_str().unwrap().to_string()));
    }
    let at = |rv: &str| format!(r#"{{"preconditions": {{"resourceVersion": "{rv}"}}}}"#);
    let (new_body, old_body) = (at(&versions["new"].1), at(&versions["old"].0));
    let new = delete_from_inside(&net, &cluster, trailing, "new", &new_body);
    let old = delete_from_inside(&net, &cluster, trailing, "old", &old_body);
    // Long enough for a member that judged from its own copy to have answered.
    tokio::time::sleep(Duration::from_millis(500)).await;
    net.heal().unwrap();
    let (mut new, mut old) = tokio::task::spawn_blocking(move || (status_of(new), status_of(old))).await.unwrap();
    // Cut off past its election timeout, the member may have campaigned and
    // unseated the leader when let back: a 503 is then the right answer,
    // and a client tries again.
    let deadline = Instant::now() + Duration::from_secs(30);
    while new.0 == 503 || old.0 == 503 {
        assert!(Instant::now() < deadline, "still unavailable: {new:?} {old:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        if new.0 == 503 {
            new = status_of(delete_from_inside(&net, &cluster, trailing, "new", &new_body));
        }
        if old.0 == 503 {
            old = status_of(delete_from_inside(&net, &cluster, trailing, "old", &old_body));
        }
    }

    assert_eq!(new.0, 200, "the version written through the leader is the object's version: {}", new.1);
    assert_eq!(old.0, 409, "the version before the update is no longer the object's: {}", old.1);
    assert!(old.1.contains("Precondition failed"), "{}", old.1);
    assert!(writer.get(cms, "default", "old").await.is_ok(), "a refused delete deletes nothing");
    let gone = writer.get(cms, "default", "new").await.expect_err("deleted");
    assert!(gone.is(Reason::NotFound), "{gone}");
}
