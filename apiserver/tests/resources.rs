//! The resource API on an in-process 3-member cluster, through the gRPC
//! client: CRUD on every kind, conflicts, finalizers, bad input, selectors
//! and paging, watch semantics, history, and the security layers.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};
use skiff_api::resources::{by_kind, of};
use skiff_api::{meta, ApiError, Kind, Reason};
use skiff_apiserver::admission::{AdmissionPlugin, AlwaysAllow, Anonymous, Attributes, Authorizer, Security, UserInfo};
use skiff_apiserver::rbac::Action;
use skiff_client::resources::{DeleteParams, EventType, ListParams, WatchEvent, WatchParams};
use skiff_client::{Client, ClientError};
use skiff_testing::InProcessCluster;

fn manifests() -> Vec<Value> {
    let text = include_str!("../../tests/manifests/kinds.yaml");
    serde_yaml::Deserializer::from_str(text)
        .map(|d| serde::Deserialize::deserialize(d).expect("manifest parses"))
        .collect()
}

/// A client of every member, starting at a follower.
async fn client(cluster: &InProcessCluster) -> Client {
    let (a, b) = cluster.follower_clients().await;
    let leader = cluster.clients.iter().find(|c| **c != a && **c != b).unwrap().clone();
    connect(cluster, &[a, b, leader])
}

/// A client of `endpoints`, as the cluster's administrator.
fn connect(cluster: &InProcessCluster, endpoints: &[String]) -> Client {
    Client::connect(endpoints, None, Some(cluster.connector())).unwrap()
}

async fn must_namespace(client: &Client, name: &str) {
    let ns = of(Kind::Namespace);
    match client.create(ns, "", &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})).await {
        Ok(_) => {}
        Err(e) if e.is(Reason::AlreadyExists) => {}
        Err(e) => panic!("namespace {name}: {e}"),
    }
}

fn rv(obj: &Value) -> i64 {
    meta::resource_version(obj).expect("resourceVersion").parse().expect("numeric resourceVersion")
}

fn api(e: ClientError) -> ApiError {
    match e {
        ClientError::Api(e) => e,
        other => panic!("expected an API error, got {other}"),
    }
}

fn configmap(ns: &str, name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns, "labels": labels},
        "data": {"k": "v"}})
}

async fn next_event(stream: &mut (impl futures::Stream<Item = Result<WatchEvent, ClientError>> + Unpin)) -> WatchEvent {
    loop {
        let e = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("a watch event within 10 s")
            .expect("the stream is open")
            .expect("no stream error");
        if e.kind != EventType::Bookmark {
            return e;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_supports_create_get_list_update_patch_and_delete() {
    let cluster = InProcessCluster::spawn(3).await;
    let client = client(&cluster).await;
    // The default namespaces appear on their own.
    for _ in 0..100 {
        if client.get(of(Kind::Namespace), "", "kube-system").await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        let got = client.get(of(Kind::Namespace), "", ns).await.unwrap();
        assert_eq!(got["status"]["phase"], "Active", "{ns}");
    }

    let docs = manifests();
    assert_eq!(docs.len(), 19, "one manifest per kind");
    let mut seen_kinds = BTreeSet::new();
    for doc in &docs {
        let info = by_kind(doc["apiVersion"].as_str().unwrap(), doc["kind"].as_str().unwrap()).unwrap();
        seen_kinds.insert(info.kind);
        let ns = meta::namespace(doc).unwrap_or_default();
        let name = meta::name(doc).unwrap();

        let created = client.create(info, ns, doc).await.unwrap_or_else(|e| panic!("create {}: {e}", info.kind));
        assert!(meta::uid(&created).is_some(), "{} has a uid", info.kind);
        assert!(created["metadata"]["creationTimestamp"].is_string());
        let got = client.get(info, ns, name).await.unwrap();
        assert_eq!(rv(&got), rv(&created), "{}", info.kind);
        assert_eq!(meta::uid(&got), meta::uid(&created));

        let listed = client.list(info, ns, &ListParams::default()).await.unwrap();
        assert!(listed.items.iter().any(|o| meta::name(o) == Some(name)), "{} listed", info.kind);
        assert!(listed.resource_version.parse::<i64>().unwrap() >= rv(&created));

        let err = api(client.create(info, ns, doc).await.unwrap_err());
        assert_eq!(err.reason, Reason::AlreadyExists, "{}", info.kind);

        let mut changed = got.clone();
        changed["metadata"]["labels"]["touched"] = json!("yes");
        let updated = client.update(info, &changed).await.unwrap_or_else(|e| panic!("update {}: {e}", info.kind));
        assert!(rv(&updated) > rv(&got));
        assert_eq!(updated["metadata"]["labels"]["touched"], "yes");
        // The version read before the update is stale now.
        let stale = api(client.update(info, &changed).await.unwrap_err());
        assert_eq!(stale.reason, Reason::Conflict, "{}", info.kind);
        assert_eq!(stale.code(), 409);

        let patched = client
            .patch(info, ns, name, "merge", &json!({"metadata": {"annotations": {"note": "patched"}}}), "")
            .await
            .unwrap();
        assert_eq!(patched["metadata"]["annotations"]["note"], "patched");
        assert_eq!(patched["metadata"]["labels"]["touched"], "yes");
        let patched = client
            .patch(info, ns, name, "json", &json!([{"op": "remove", "path": "/metadata/annotations/note"}]), "")
            .await
            .unwrap();
        assert!(patched["metadata"]["annotations"].get("note").is_none());
    }
    assert_eq!(seen_kinds.len(), 19);

    // Delete everything but the namespace, newest first.
    for doc in docs.iter().rev().filter(|d| d["kind"] != "Namespace") {
        let info = by_kind(doc["apiVersion"].as_str().unwrap(), doc["kind"].as_str().unwrap()).unwrap();
        let ns = meta::namespace(doc).unwrap_or_default();
        let name = meta::name(doc).unwrap();
        client.delete(info, ns, name, &DeleteParams::default()).await.unwrap();
        let gone = api(client.get(info, ns, name).await.unwrap_err());
        assert_eq!(gone.reason, Reason::NotFound, "{}", info.kind);
        assert_eq!(api(client.delete(info, ns, name, &DeleteParams::default()).await.unwrap_err()).code(), 404);
    }
    // A namespace is finalized by its controller: deleting it marks it
    // Terminating, and nothing new may be created in it.
    let deleted = client.delete(of(Kind::Namespace), "", "crud", &DeleteParams::default()).await.unwrap();
    assert_eq!(deleted["status"]["phase"], "Terminating");
    assert!(deleted["metadata"]["deletionTimestamp"].is_string());
    let refused =
        api(client.create(of(Kind::ConfigMap), "crud", &configmap("crud", "late", json!({}))).await.unwrap_err());
    assert_eq!(refused.reason, Reason::Forbidden);
    assert!(refused.message.contains("being terminated"), "{}", refused.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_stays_terminating_until_finalized_through_its_subresource() {
    let cluster = InProcessCluster::spawn(3).await;
    let client = client(&cluster).await;
    let namespaces = of(Kind::Namespace);
    let created = client
        .create(
            namespaces,
            "",
            &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "doomed"},
            "spec": {"finalizers": ["example.com/x"]}}),
        )
        .await
        .unwrap();
    assert_eq!(created["spec"]["finalizers"], json!(["example.com/x", "kubernetes"]));
    // An update cannot drop them; only finalize can.
    let mut plain = created.clone();
    plain["spec"]["finalizers"] = json!([]);
    let updated = client.update(namespaces, &plain).await.unwrap();
    assert_eq!(updated["spec"]["finalizers"], json!(["example.com/x", "kubernetes"]));

    let marked = client.delete(namespaces, "", "doomed", &DeleteParams::default()).await.unwrap();
    assert_eq!(marked["status"]["phase"], "Terminating");
    // A status write on the terminating namespace does not complete the delete.
    let mut status = marked.clone();
    status["status"]["conditions"] = json!([{"type": "NamespaceContentRemaining", "status": "False"}]);
    client.update_status(namespaces, &status).await.unwrap();
    let still = client.get(namespaces, "", "doomed").await.unwrap();
    assert_eq!(still["status"]["phase"], "Terminating");

    let mut finalize = still.clone();
    finalize["spec"]["finalizers"] = json!(["example.com/x"]);
    let partly = client.update_subresource(namespaces, &finalize, "finalize").await.unwrap();
    assert_eq!(partly["spec"]["finalizers"], json!(["example.com/x"]));
    let mut finalize = partly.clone();
    finalize["spec"]["finalizers"] = json!([]);
    client.update_subresource(namespaces, &finalize, "finalize").await.unwrap();
    assert_eq!(api(client.get(namespaces, "", "doomed").await.unwrap_err()).reason, Reason::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finalizers_hold_a_delete_until_the_last_one_is_removed() {
    let cluster = InProcessCluster::spawn(3).await;
    let client = client(&cluster).await;
    must_namespace(&client, "fin").await;
    let cms = of(Kind::ConfigMap);
    let mut cm = configmap("fin", "held", json!({}));
    cm["metadata"]["finalizers"] = json!(["example.com/a", "example.com/b"]);
    client.create(cms, "fin", &cm).await.unwrap();

    let marked = client.delete(cms, "fin", "held", &DeleteParams::default()).await.unwrap();
    assert!(marked["metadata"]["deletionTimestamp"].is_string());
    let still = client.get(cms, "fin", "held").await.unwrap();
    assert_eq!(meta::finalizers(&still).len(), 2);

    let one = client
        .patch(cms, "fin", "held", "merge", &json!({"metadata": {"finalizers": ["example.com/b"]}}), "")
        .await
        .unwrap();
    assert_eq!(meta::finalizers(&one), vec!["example.com/b".to_string()]);
    client.get(cms, "fin", "held").await.unwrap();
    client.patch(cms, "fin", "held", "merge", &json!({"metadata": {"finalizers": null}}), "").await.unwrap();
    assert_eq!(api(client.get(cms, "fin", "held").await.unwrap_err()).reason, Reason::NotFound);

    // Orphan and Foreground propagation are finalizers the garbage collector honours.
    client.create(cms, "fin", &configmap("fin", "orphaned", json!({}))).await.unwrap();
    let params = DeleteParams { propagation_policy: "Orphan".into(), ..Default::default() };
    let marked = client.delete(cms, "fin", "orphaned", &params).await.unwrap();
    assert_eq!(meta::finalizers(&marked), vec!["orphan".to_string()]);

    // generateName: the server picks a unique name with that prefix.
    let generated = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "gen-"}});
    let a = client.create(cms, "fin", &generated).await.unwrap();
    let b = client.create(cms, "fin", &generated).await.unwrap();
    let (a, b) = (meta::name(&a).unwrap(), meta::name(&b).unwrap());
    assert!(a.starts_with("gen-") && a.len() == 9 && a != b, "{a} {b}");

    // Preconditions on uid and resourceVersion.
    let cm = client.create(cms, "fin", &configmap("fin", "guarded", json!({}))).await.unwrap();
    let wrong_uid = DeleteParams { uid: "not-it".into(), ..Default::default() };
    assert_eq!(api(client.delete(cms, "fin", "guarded", &wrong_uid).await.unwrap_err()).reason, Reason::Conflict);
    let wrong_rv = DeleteParams { resource_version: "1".into(), ..Default::default() };
    assert_eq!(api(client.delete(cms, "fin", "guarded", &wrong_rv).await.unwrap_err()).reason, Reason::Conflict);
    let right = DeleteParams {
        uid: meta::uid(&cm).unwrap().into(),
        resource_version: rv(&cm).to_string(),
        ..Default::default()
    };
    client.delete(cms, "fin", "guarded", &right).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_with_a_reason_and_nothing_is_written() {
    let cluster = InProcessCluster::spawn(3).await;
    let client = client(&cluster).await;
    must_namespace(&client, "bad").await;
    let pods = of(Kind::Pod);
    let cms = of(Kind::ConfigMap);

    let bad_name = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "Web_1"},
        "spec": {"containers": [{"name": "web", "image": "nginx"}]}});
    let e = api(client.create(pods, "bad", &bad_name).await.unwrap_err());
    assert_eq!((e.reason, e.code()), (Reason::Invalid, 422));
    assert_eq!(e.details.as_ref().unwrap().causes[0].field, "metadata.name", "{e:?}");

    let no_image = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"},
        "spec": {"containers": [{"name": "web"}]}});
    let e = api(client.create(pods, "bad", &no_image).await.unwrap_err());
    assert_eq!(e.reason, Reason::Invalid);
    assert!(e.details.unwrap().causes.iter().any(|c| c.field == "spec.containers[0].image"));

    let wrong_shape =
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"}, "spec": {"containers": "nginx"}});
    let e = api(client.create(pods, "bad", &wrong_shape).await.unwrap_err());
    assert_eq!(e.code(), 400);
    assert!(e.message.contains("spec.containers"), "{}", e.message);

    let wrong_version = json!({"apiVersion": "v2", "kind": "ConfigMap", "metadata": {"name": "x"}});
    let e = api(client.create(cms, "bad", &wrong_version).await.unwrap_err());
    assert_eq!(e.reason, Reason::BadRequest);
    assert!(e.message.contains("v2"), "{}", e.message);

    // A ConfigMap's data is limited to 1 MiB by validation...
    let mut big = configmap("bad", "big", json!({}));
    big["data"]["blob"] = json!("x".repeat(1024 * 1024 + 1));
    let e = api(client.create(cms, "bad", &big).await.unwrap_err());
    assert_eq!(e.reason, Reason::Invalid, "{e:?}");
    // ...and any object to 1.5 MiB by the store.
    let mut huge = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "huge"},
        "spec": {"containers": [{"name": "c", "image": "busybox", "env": [{"name": "BLOB", "value": "x"}]}]}});
    huge["spec"]["containers"][0]["env"][0]["value"] = json!("x".repeat(2 * 1024 * 1024));
    let e = api(client.create(pods, "bad", &huge).await.unwrap_err());
    assert_eq!(e.code(), 413, "{e:?}");

    let e = api(client.get_with(cms, "bad", "x", "abc").await.unwrap_err());
    assert_eq!(e.reason, Reason::BadRequest);
    let e = api(client
        .list(cms, "bad", &ListParams { label_selector: "a in (b".into(), ..Default::default() })
        .await
        .unwrap_err());
    assert_eq!(e.reason, Reason::BadRequest);
    let e = api(client
        .list(pods, "bad", &ListParams { field_selector: "spec.color=red".into(), ..Default::default() })
        .await
        .unwrap_err());
    assert_eq!(e.reason, Reason::BadRequest);
    assert!(e.message.contains("field label not supported: spec.color"), "{}", e.message);
    let e = api(client.create(cms, "missing-ns", &configmap("missing-ns", "x", json!({}))).await.unwrap_err());
    assert_eq!(e.reason, Reason::NotFound);
    assert!(e.message.contains("namespaces \"missing-ns\" not found"), "{}", e.message);

    // Malformed JSON, straight over gRPC.
    let mut raw =
        skiff_proto::resource::resources_client::ResourcesClient::new(cluster.channel(&cluster.clients[0]).await);
    let status = raw
        .create(skiff_proto::resource::CreateRequest {
            resource: Some(skiff_proto::resource::ResourceRef {
                group: String::new(),
                resource: "configmaps".into(),
                namespace: "bad".into(),
            }),
            json: b"{\"kind\": ".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    let e = skiff_client::resources::api_error(&status);
    assert_eq!(e.reason, Reason::BadRequest);
    let status = raw
        .get(skiff_proto::resource::GetRequest {
            resource: Some(skiff_proto::resource::ResourceRef {
                group: String::new(),
                resource: "widgets".into(),
                namespace: "bad".into(),
            }),
            name: "x".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::NotFound);

    // Nothing of the above was stored.
    for info in [pods, cms] {
        assert!(client.list(info, "bad", &ListParams::default()).await.unwrap().items.is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_filter_by_labels_and_fields_and_page_with_continue_tokens() {
    let cluster = InProcessCluster::spawn(3).await;
    let client = client(&cluster).await;
    must_namespace(&client, "page").await;
    let cms = of(Kind::ConfigMap);
    for i in 0..25 {
        let tier = if i % 5 == 0 { "db" } else { "web" };
        client.create(cms, "page", &configmap("page", &format!("cm-{i:02}"), json!({"tier": tier}))).await.unwrap();
    }
    let first = client.list(cms, "page", &ListParams { limit: 10, ..Default::default() }).await.unwrap();
    assert_eq!(first.items.len(), 10);
    assert_eq!(first.remaining_item_count, Some(15));
    assert!(!first.continue_token.is_empty());
    // A write between pages does not show: every page is read at the first page's revision.
    client.create(cms, "page", &configmap("page", "cm-99", json!({"tier": "web"}))).await.unwrap();
    let mut names: Vec<String> = first.items.iter().map(|o| meta::name(o).unwrap().to_string()).collect();
    let mut token = first.continue_token.clone();
    while !token.is_empty() {
        let page = client
            .list(cms, "page", &ListParams { limit: 10, continue_token: token, ..Default::default() })
            .await
            .unwrap();
        assert_eq!(page.resource_version, first.resource_version);
        names.extend(page.items.iter().map(|o| meta::name(o).unwrap().to_string()));
        token = page.continue_token;
    }
    let expected: Vec<String> = (0..25).map(|i| format!("cm-{i:02}")).collect();
    assert_eq!(names, expected);

    let dbs =
        client.list(cms, "page", &ListParams { label_selector: "tier=db".into(), ..Default::default() }).await.unwrap();
    assert_eq!(dbs.items.len(), 5);
    let not_db = client
        .list(cms, "page", &ListParams { label_selector: "tier!=db,tier".into(), limit: 7, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(not_db.items.len(), 7);
    let named = client
        .list(cms, "page", &ListParams { field_selector: "metadata.name=cm-03".into(), ..Default::default() })
        .await
        .unwrap();
    assert_eq!(named.items.len(), 1);
    let bad = client.list(cms, "page", &ListParams { continue_token: "garbage".into(), ..Default::default() }).await;
    assert_eq!(api(bad.unwrap_err()).reason, Reason::BadRequest);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_follow_selectors_resume_from_revisions_and_expire_after_compaction() {
    let cluster = InProcessCluster::spawn(3).await;
    let client = client(&cluster).await;
    must_namespace(&client, "w").await;
    let cms = of(Kind::ConfigMap);
    // "": the current state (read linearizably, so "early" is in it) first.
    let params = WatchParams { label_selector: "app=a".into(), ..Default::default() };
    let before = client.create(cms, "w", &configmap("w", "early", json!({"app": "a"}))).await.unwrap();
    let mut w = Box::pin(client.watch(cms, "w", &params).await.unwrap());
    let e = next_event(&mut w).await;
    assert_eq!((e.kind, meta::name(&e.object)), (EventType::Added, Some("early")));

    let x = client.create(cms, "w", &configmap("w", "x", json!({"app": "a"}))).await.unwrap();
    client.create(cms, "w", &configmap("w", "other", json!({"app": "b"}))).await.unwrap();
    let relabeled =
        client.patch(cms, "w", "x", "merge", &json!({"metadata": {"labels": {"app": "b"}}}), "").await.unwrap();
    let back = client.patch(cms, "w", "x", "merge", &json!({"metadata": {"labels": {"app": "a"}}}), "").await.unwrap();
    let changed = client.patch(cms, "w", "x", "merge", &json!({"data": {"k": "v2"}}), "").await.unwrap();
    client.delete(cms, "w", "x", &DeleteParams::default()).await.unwrap();

    let mut got = Vec::new();
    for _ in 0..5 {
        let e = next_event(&mut w).await;
        got.push((e.kind, meta::name(&e.object).unwrap().to_string(), rv(&e.object)));
    }
    let expect = [
        (EventType::Added, "x".to_string(), rv(&x)),
        (EventType::Deleted, "x".to_string(), rv(&relabeled)),
        (EventType::Added, "x".to_string(), rv(&back)),
        (EventType::Modified, "x".to_string(), rv(&changed)),
    ];
    assert_eq!(&got[..4], &expect[..]);
    assert_eq!(got[4].0, EventType::Deleted);
    assert!(got[4].2 > rv(&changed));

    // Resume after the first event: the same events again, no more.
    let resumed =
        WatchParams { label_selector: "app=a".into(), resource_version: rv(&x).to_string(), ..Default::default() };
    let mut w2 = Box::pin(client.watch(cms, "w", &resumed).await.unwrap());
    for expected in &got[1..] {
        let e = next_event(&mut w2).await;
        assert_eq!((e.kind, meta::name(&e.object).unwrap().to_string(), rv(&e.object)), expected.clone());
    }

    // Once history is compacted, an old revision is 410 Expired.
    let mut kv = skiff_proto::etcdserverpb::kv_client::KvClient::new(cluster.channel(&cluster.clients[0]).await);
    kv.compact(skiff_proto::etcdserverpb::CompactionRequest { revision: rv(&changed), physical: true }).await.unwrap();
    // The compaction is answered once the leader applied it; the follower
    // serving the watch applies it when it learns of the commit (its next
    // heartbeat) and until then still holds, and serves, that history, as
    // an etcd member would. So retry for a bounded time until it refuses.
    let old = WatchParams { resource_version: rv(&before).to_string(), ..Default::default() };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let e = loop {
        match client.watch(cms, "w", &old).await {
            Err(e) => break api(e),
            Ok(s) => {
                let mut s = Box::pin(s);
                let e = s.next().await.unwrap().unwrap();
                if e.kind == EventType::Error {
                    break ApiError::from_status(&e.object).unwrap();
                }
                assert!(tokio::time::Instant::now() < deadline, "a watch from a compacted revision still served {e:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert_eq!(e.code(), 410, "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_get_bookmarks_and_initial_events_end_markers() {
    let cluster = InProcessCluster::spawn(3).await;
    let client = client(&cluster).await;
    must_namespace(&client, "bm").await;
    let cms = of(Kind::ConfigMap);
    let created = client.create(cms, "bm", &configmap("bm", "one", json!({}))).await.unwrap();
    let params = WatchParams {
        resource_version: rv(&created).to_string(),
        send_initial_events: true,
        allow_bookmarks: true,
        ..Default::default()
    };
    let mut w = Box::pin(client.watch(cms, "bm", &params).await.unwrap());
    let e = w.next().await.unwrap().unwrap();
    assert_eq!((e.kind, meta::name(&e.object)), (EventType::Added, Some("one")));
    let e = w.next().await.unwrap().unwrap();
    assert_eq!(e.kind, EventType::Bookmark);
    assert_eq!(e.object["metadata"]["annotations"]["k8s.io/initial-events-end"], "true");
    // Writes elsewhere advance the bookmarks' revision (interval: 300 ms in tests).
    let other = client.create(of(Kind::Namespace), "", &json!({"metadata": {"name": "bm-other"}})).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let e = tokio::time::timeout_at(deadline, w.next()).await.expect("a bookmark past the write").unwrap().unwrap();
        assert_eq!(e.kind, EventType::Bookmark);
        if rv(&e.object) >= rv(&other) {
            break;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_that_stops_reading_is_cut_off_while_others_get_everything() {
    let cluster = InProcessCluster::spawn(3).await;
    let client = client(&cluster).await;
    must_namespace(&client, "slow").await;
    let cms = of(Kind::ConfigMap);
    let start = client.create(cms, "slow", &configmap("slow", "base", json!({}))).await.unwrap();
    let params = WatchParams { resource_version: rv(&start).to_string(), ..Default::default() };
    let mut stalled = Box::pin(client.watch(cms, "slow", &params).await.unwrap());
    let mut reader = Box::pin(client.watch(cms, "slow", &params).await.unwrap());

    // More than the watcher's queue and the connection's flow-control
    // windows hold (about 8 MiB in all).
    const WRITES: usize = 4000;
    let counter = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let writers: Vec<_> = (0..16)
        .map(|_| {
            let client = client.clone();
            let counter = counter.clone();
            tokio::spawn(async move {
                loop {
                    let i = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= WRITES {
                        return;
                    }
                    let mut cm = configmap("slow", &format!("cm-{i}"), json!({}));
                    cm["data"]["padding"] = json!("p".repeat(2048));
                    client.create(cms, "slow", &cm).await.unwrap();
                }
            })
        })
        .collect();
    let mut last = rv(&start);
    for _ in 0..WRITES {
        let e = next_event(&mut reader).await;
        assert_eq!(e.kind, EventType::Added);
        assert!(rv(&e.object) > last, "in order, no duplicates");
        last = rv(&e.object);
    }
    for w in writers {
        w.await.unwrap();
    }
    // The stalled watcher got what fit in its buffers, then an ERROR saying why.
    let mut delivered = 0;
    let error = loop {
        let e = tokio::time::timeout(Duration::from_secs(10), stalled.next()).await.unwrap().unwrap().unwrap();
        match e.kind {
            EventType::Added => delivered += 1,
            EventType::Error => break ApiError::from_status(&e.object).unwrap(),
            other => panic!("unexpected {other}"),
        }
    };
    assert!(delivered < WRITES, "the stalled watcher was cut off before the end");
    assert_eq!(error.reason, Reason::TooManyRequests);
    assert!(error.message.contains("resume from resourceVersion"), "{}", error.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_get_unique_cluster_ips_and_node_ports() {
    let cluster = InProcessCluster::spawn(3).await;
    let client = client(&cluster).await;
    must_namespace(&client, "svc").await;
    let svcs = of(Kind::Service);
    let service = |name: &str, node_port: Option<i64>| {
        let mut port = json!({"port": 80});
        let mut spec = json!({"selector": {"app": name}, "ports": []});
        if let Some(p) = node_port {
            port["nodePort"] = json!(p);
            spec["type"] = json!("NodePort");
        }
        spec["ports"] = json!([port]);
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "svc"}, "spec": spec})
    };
    let creates: Vec<_> = (0..20)
        .map(|i| {
            let client = client.clone();
            let svc = service(&format!("s{i}"), None);
            tokio::spawn(async move { client.create(svcs, "svc", &svc).await.unwrap() })
        })
        .collect();
    let mut ips = BTreeSet::new();
    for c in creates {
        let s = c.await.unwrap();
        assert_eq!(s["spec"]["type"], "ClusterIP");
        assert!(ips.insert(s["spec"]["clusterIP"].as_str().unwrap().to_string()));
    }
    assert_eq!(ips.len(), 20);
    let first = client.create(svcs, "svc", &service("np1", Some(30080))).await.unwrap();
    assert_eq!(first["spec"]["ports"][0]["nodePort"], 30080);
    let e = api(client.create(svcs, "svc", &service("np2", Some(30080))).await.unwrap_err());
    assert_eq!(e.reason, Reason::Invalid);
    assert_eq!(e.details.unwrap().causes[0].field, "spec.ports[0].nodePort");
    client.delete(svcs, "svc", "np1", &DeleteParams::default()).await.unwrap();
    client.create(svcs, "svc", &service("np2", Some(30080))).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subresources_bind_pods_update_status_and_scale() {
    let cluster = InProcessCluster::spawn(3).await;
    let client = client(&cluster).await;
    must_namespace(&client, "sub").await;
    let pods = of(Kind::Pod);
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "sub"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
    let created = client.create(pods, "sub", &pod).await.unwrap();
    assert_eq!(created["status"]["phase"], "Pending");
    client.bind("sub", "p", "node-1").await.unwrap();
    let bound = client.get(pods, "sub", "p").await.unwrap();
    assert_eq!(bound["spec"]["nodeName"], "node-1");
    assert_eq!(api(client.bind("sub", "p", "node-2").await.unwrap_err()).reason, Reason::Conflict);

    let mut status = bound.clone();
    status["status"]["phase"] = json!("Running");
    status["spec"]["containers"][0]["image"] = json!("ignored");
    let after = client.update_status(pods, &status).await.unwrap();
    assert_eq!(after["status"]["phase"], "Running");
    assert_eq!(after["spec"]["containers"][0]["image"], "busybox", "a status update leaves the spec alone");
    // ...and a main update leaves the status alone.
    let mut main = after.clone();
    main["status"]["phase"] = json!("Failed");
    main["metadata"]["labels"] = json!({"x": "y"});
    let after = client.update(pods, &main).await.unwrap();
    assert_eq!(after["status"]["phase"], "Running");

    // A scheduled pod is deleted gracefully: its node agent finishes the job.
    let marked = client.delete(pods, "sub", "p", &DeleteParams::default()).await.unwrap();
    assert_eq!(marked["metadata"]["deletionGracePeriodSeconds"], 30);
    client.get(pods, "sub", "p").await.unwrap();
    let now = DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
    client.delete(pods, "sub", "p", &now).await.unwrap();
    assert_eq!(api(client.get(pods, "sub", "p").await.unwrap_err()).reason, Reason::NotFound);

    let deploys = of(Kind::Deployment);
    let d = manifests().into_iter().find(|d| d["kind"] == "Deployment").unwrap();
    let mut d = d;
    d["metadata"]["namespace"] = json!("sub");
    let created = client.create(deploys, "sub", &d).await.unwrap();
    assert_eq!(created["metadata"]["generation"], 1);
    let relabeled =
        client.patch(deploys, "sub", "web", "merge", &json!({"metadata": {"labels": {"a": "b"}}}), "").await.unwrap();
    assert_eq!(relabeled["metadata"]["generation"], 1, "metadata changes do not bump generation");
    let scale = client.get_scale(deploys, "sub", "web").await.unwrap();
    assert_eq!(scale["spec"]["replicas"], 3);
    assert_eq!(scale["kind"], "Scale");
    client.patch(deploys, "sub", "web", "merge", &json!({"spec": {"replicas": 5}}), "scale").await.unwrap();
    let scaled = client.get(deploys, "sub", "web").await.unwrap();
    assert_eq!(scaled["spec"]["replicas"], 5);
    assert_eq!(scaled["metadata"]["generation"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_ranges_default_new_pods_and_refuse_those_out_of_range() {
    let cluster = InProcessCluster::spawn(3).await;
    let client = client(&cluster).await;
    must_namespace(&client, "limited").await;
    must_namespace(&client, "free").await;
    let ranges = of(Kind::LimitRange);
    let range = json!({"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "lr", "namespace": "limited"},
        "spec": {"limits": [{"type": "Container", "default": {"cpu": "500m", "memory": "128Mi"},
            "defaultRequest": {"cpu": "100m"}, "max": {"cpu": "1", "memory": "1Gi"}}]}});
    client.create(ranges, "limited", &range).await.unwrap();
    // LimitRanges apply on each member once it has them, as Kubernetes'
    // plugin reads its cache: a linearizable read makes sure.
    client.get(ranges, "limited", "lr").await.unwrap();

    let pods = of(Kind::Pod);
    let pod = |ns: &str, name: &str, resources: Value| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": {"containers": [{"name": "c", "image": "busybox", "resources": resources}]}})
    };
    let created = client.create(pods, "limited", &pod("limited", "small", json!({}))).await.unwrap();
    let r = &created["spec"]["containers"][0]["resources"];
    assert_eq!(r["limits"], json!({"cpu": "500m", "memory": "128Mi"}), "{created}");
    assert_eq!(r["requests"], json!({"cpu": "100m", "memory": "128Mi"}), "{created}");
    let note = created["metadata"]["annotations"]["kubernetes.io/limit-ranger"].as_str().unwrap();
    assert_eq!(note, "LimitRanger plugin set: cpu, memory request for container c; cpu, memory limit for container c");
    assert_eq!(created["status"]["qosClass"], "Burstable", "the QoS class follows the defaulted resources");

    let big = pod("limited", "big", json!({"limits": {"cpu": "2"}}));
    let err = api(client.create(pods, "limited", &big).await.unwrap_err());
    assert_eq!(err.reason, Reason::Forbidden);
    assert!(err.message.contains("maximum cpu usage per Container is 1, but limit is 2"), "{}", err.message);
    assert_eq!(api(client.get(pods, "limited", "big").await.unwrap_err()).reason, Reason::NotFound);

    // Other namespaces, and updates, are not touched.
    let free = client.create(pods, "free", &pod("free", "big", json!({"limits": {"cpu": "2"}}))).await.unwrap();
    assert_eq!(free["spec"]["containers"][0]["resources"], json!({"limits": {"cpu": "2"}, "requests": {"cpu": "2"}}));
    let relabeled =
        client.patch(pods, "limited", "small", "merge", &json!({"metadata": {"labels": {"a": "b"}}}), "").await;
    assert_eq!(relabeled.unwrap()["spec"]["containers"][0]["resources"], created["spec"]["containers"][0]["resources"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_admits_exactly_its_limit_of_pods_created_concurrently_through_every_member() {
    let cluster = InProcessCluster::spawn(3).await;
    let admin = client(&cluster).await;
    must_namespace(&admin, "quoted").await;
    let quotas = of(Kind::ResourceQuota);
    let hard = json!({"pods": "7", "requests.cpu": "2"});
    let quota = json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "q", "namespace": "quoted"},
        "spec": {"hard": hard}});
    let created = admin.create(quotas, "quoted", &quota).await.unwrap();
    let pods = of(Kind::Pod);
    let pod = |name: String, cpu: &str| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "quoted"},
            "spec": {"containers": [{"name": "c", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}]}})
    };
    // Until the usage is known (the controller's job; no controller runs
    // here), what the quota tracks is refused.
    let err = api(admin.create(pods, "quoted", &pod("early".into(), "100m")).await.unwrap_err());
    assert!(err.message.contains("status unknown for quota: q, resources: pods,requests.cpu"), "{}", err.message);
    let mut counted = created.clone();
    counted["status"] = json!({"hard": hard, "used": {"pods": "0", "requests.cpu": "0"}});
    admin.update_status(quotas, &counted).await.unwrap();

    // 20 creates of 250m each at once, spread over the three members: the
    // cpu allows 8, the count 7, so exactly 7 are admitted.
    let members: Vec<Client> = cluster.clients.iter().map(|c| connect(&cluster, std::slice::from_ref(c))).collect();
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let client = members[i % members.len()].clone();
            let obj = pod(format!("p{i}"), "250m");
            tokio::spawn(async move { client.create(pods, "quoted", &obj).await })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(_) => admitted += 1,
            Err(e) => {
                let e = api(e);
                assert_eq!(e.reason, Reason::Forbidden, "{}", e.message);
                assert!(
                    e.message.contains("exceeded quota: q, requested: pods=1, used: pods=7, limited: pods=7"),
                    "{}",
                    e.message
                );
            }
        }
    }
    assert_eq!(admitted, 7);
    let listed = admin.list(pods, "quoted", &ListParams::default()).await.unwrap();
    assert_eq!(listed.items.len(), 7);
    let q = admin.get(quotas, "quoted", "q").await.unwrap();
    assert_eq!(q["status"]["used"], json!({"pods": "7", "requests.cpu": "1750m"}));

    // What the quota does not track goes through; what it does stays refused.
    admin.create(of(Kind::ConfigMap), "quoted", &configmap("quoted", "free", json!({}))).await.unwrap();
    let err = api(admin.create(pods, "quoted", &pod("more".into(), "1m")).await.unwrap_err());
    assert_eq!(err.reason, Reason::Forbidden);
    assert_eq!(admin.get(quotas, "quoted", "q").await.unwrap()["status"]["used"]["pods"], "7");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_enforcing_a_pod_security_level_refuses_pods_that_break_it() {
    let cluster = InProcessCluster::spawn(3).await;
    let client = client(&cluster).await;
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "guarded",
        "labels": {"pod-security.kubernetes.io/enforce": "baseline"}}});
    client.create(of(Kind::Namespace), "", &ns).await.unwrap();
    must_namespace(&client, "open").await;
    let pods = of(Kind::Pod);
    let pod = |ns: &str, name: &str, security: Value| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": {"hostNetwork": true, "containers": [{"name": "c", "image": "busybox", "securityContext": security}]}})
    };
    let err =
        api(client.create(pods, "guarded", &pod("guarded", "root", json!({"privileged": true}))).await.unwrap_err());
    assert_eq!(err.reason, Reason::Forbidden);
    assert_eq!(
        err.message,
        "pods \"root\" is forbidden: violates PodSecurity \"baseline:latest\": host namespaces (hostNetwork=true), \
         privileged (container \"c\" must not set securityContext.privileged=true)"
    );
    client.create(pods, "open", &pod("open", "root", json!({"privileged": true}))).await.unwrap();
    let mut fine = pod("guarded", "fine", json!({}));
    fine["spec"]["hostNetwork"] = json!(false);
    client.create(pods, "guarded", &fine).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_lists_every_revision_and_get_at_revision_shows_each() {
    let cluster = InProcessCluster::spawn(3).await;
    let client = client(&cluster).await;
    must_namespace(&client, "h").await;
    let cms = of(Kind::ConfigMap);
    let v1 = client.create(cms, "h", &configmap("h", "cfg", json!({}))).await.unwrap();
    let v2 = client.patch(cms, "h", "cfg", "merge", &json!({"data": {"k": "v2"}}), "").await.unwrap();
    let v3 = client.patch(cms, "h", "cfg", "merge", &json!({"data": {"extra": "1"}}), "").await.unwrap();
    client.delete(cms, "h", "cfg", &DeleteParams::default()).await.unwrap();
    let v5 = client.create(cms, "h", &configmap("h", "cfg", json!({}))).await.unwrap();

    let h = client.history(cms, "h", "cfg").await.unwrap();
    let kinds: Vec<&str> = h.entries.iter().map(|e| e.r#type.as_str()).collect();
    assert_eq!(kinds, vec!["ADDED", "MODIFIED", "MODIFIED", "DELETED", "ADDED"]);
    let revs: Vec<i64> = h.entries.iter().map(|e| e.revision).collect();
    assert_eq!(&revs[..3], &[rv(&v1), rv(&v2), rv(&v3)]);
    assert_eq!(revs[4], rv(&v5));
    assert!(h.entries.iter().all(|e| e.commit_time_ms > 0));
    assert!(h.entries[1].summary.contains("data.k"), "{}", h.entries[1].summary);
    assert_eq!(h.entries[3].summary, "deleted");

    let at2 = client.get_at_revision(cms, "h", "cfg", rv(&v2)).await.unwrap();
    assert_eq!(at2["data"]["k"], "v2");
    assert!(at2["data"].get("extra").is_none());
    let at_delete = api(client.get_at_revision(cms, "h", "cfg", revs[3]).await.unwrap_err());
    assert_eq!(at_delete.reason, Reason::NotFound);
    let before = api(client.get_at_revision(cms, "h", "cfg", rv(&v1) - 1).await.unwrap_err());
    assert_eq!(before.reason, Reason::NotFound);
}

struct DenyDeletes;

impl Authorizer for DenyDeletes {
    fn authorize(&self, user: &UserInfo, action: &Action<'_>) -> Result<(), String> {
        if let Action::Resource { verb: "delete", .. } = action {
            return Err(format!("User \"{}\" cannot delete", user.name));
        }
        AlwaysAllow.authorize(user, action)
    }
}

struct NoForbiddenLabel;

impl AdmissionPlugin for NoForbiddenLabel {
    fn name(&self) -> &'static str {
        "NoForbiddenLabel"
    }

    fn admit(&self, _: &Attributes<'_>, object: &mut Value, _: Option<&Value>) -> Result<(), ApiError> {
        object["metadata"]["annotations"]["admitted-by"] = json!("test");
        Ok(())
    }

    fn validate(&self, a: &Attributes<'_>, object: &Value, _: Option<&Value>) -> Result<(), ApiError> {
        if meta::labels(object).contains_key("forbidden") {
            return Err(skiff_apiserver::admission::forbidden(a, "the label \"forbidden\" is not admitted"));
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authorization_and_admission_layers_can_refuse_and_mutate() {
    let security = Security::new(vec![Arc::new(Anonymous)], Arc::new(DenyDeletes), vec![Arc::new(NoForbiddenLabel)]);
    let cluster = InProcessCluster::spawn_with(1, security).await;
    let client = connect(&cluster, &cluster.clients);
    must_namespace(&client, "sec").await;
    let cms = of(Kind::ConfigMap);
    let admitted = client.create(cms, "sec", &configmap("sec", "ok", json!({}))).await.unwrap();
    assert_eq!(admitted["metadata"]["annotations"]["admitted-by"], "test");
    let e = api(client.create(cms, "sec", &configmap("sec", "no", json!({"forbidden": "yes"}))).await.unwrap_err());
    assert_eq!((e.reason, e.code()), (Reason::Forbidden, 403));
    let e = api(client.delete(cms, "sec", "ok", &DeleteParams::default()).await.unwrap_err());
    assert_eq!(e.reason, Reason::Forbidden);
    assert!(e.message.contains("configmaps \"ok\" is forbidden"), "{}", e.message);
    client.get(cms, "sec", "ok").await.unwrap();
    assert_eq!(api(client.get(cms, "sec", "no").await.unwrap_err()).reason, Reason::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_record_their_managers_and_a_server_side_apply_conflicts_with_them() {
    let cluster = InProcessCluster::spawn(3).await;
    let client = client(&cluster).await;
    must_namespace(&client, "own").await;
    let cms = of(Kind::ConfigMap);
    let created = client.create(cms, "own", &configmap("own", "c", json!({"a": "b"}))).await.unwrap();
    let entries = created["metadata"]["managedFields"].as_array().expect("a create records its manager");
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0]["operation"], "Update");
    assert_eq!(entries[0]["apiVersion"], "v1");
    assert_eq!(
        entries[0]["fieldsV1"],
        json!({"f:data": {".": {}, "f:k": {}}, "f:metadata": {"f:labels": {".": {}, "f:a": {}}}})
    );
    let manager = entries[0]["manager"].as_str().unwrap().to_string();

    let config =
        |data: Value| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": data});
    let applied = client.patch(cms, "own", "c", "apply", &config(json!({"x": "1"})), "").await.unwrap();
    assert_eq!(applied["data"], json!({"k": "v", "x": "1"}), "an apply merges into the live object");
    assert_eq!(applied["metadata"]["managedFields"][0]["operation"], "Apply");
    assert_eq!(applied["metadata"]["managedFields"][0]["fieldsV1"], json!({"f:data": {"f:x": {}}}));

    let err = api(client.patch(cms, "own", "c", "apply", &config(json!({"k": "changed"})), "").await.unwrap_err());
    assert_eq!(err.reason, Reason::Conflict);
    assert_eq!(err.message, format!("Apply failed with 1 conflict: conflict with \"{manager}\" using v1: .data.k"));
    assert_eq!(client.get(cms, "own", "c").await.unwrap()["data"]["k"], "v", "a conflict writes nothing");

    // Applying what no longer names x removes it; an apply creates a missing object.
    let applied = client.patch(cms, "own", "c", "apply", &config(json!({"k": "v"})), "").await.unwrap();
    assert_eq!(applied["data"], json!({"k": "v"}));
    let fresh = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "fresh"}, "data": {"z": "1"}});
    let made = client.patch(cms, "own", "fresh", "apply", &fresh, "").await.unwrap();
    assert_eq!(made["data"]["z"], "1");
    assert!(rv(&made) > 0);
    assert_eq!(made["metadata"]["managedFields"].as_array().unwrap().len(), 1);
}
