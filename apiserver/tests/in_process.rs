//! In-process 3-member cluster: writes through followers, linearizable
//! reads, watches across members, history and the gRPC-only options that
//! etcdctl 3.4 cannot send (count_only, progress_notify).

use std::time::Duration;

use skiff_proto::control::control_client::ControlClient;
use skiff_proto::control::HistoryRequest;
use skiff_proto::etcdserverpb::kv_client::KvClient;
use skiff_proto::etcdserverpb::lease_client::LeaseClient;
use skiff_proto::etcdserverpb::watch_client::WatchClient;
use skiff_proto::etcdserverpb::{
    watch_request, LeaseGrantRequest, LeaseKeepAliveRequest, PutRequest, RangeRequest, WatchCreateRequest,
    WatchRequest, WatchResponse,
};
use tonic::transport::Channel;

use skiff_testing::InProcessCluster;

async fn watch(cluster: &InProcessCluster, addr: &str, create: WatchCreateRequest) -> tonic::Streaming<WatchResponse> {
    watch_on(cluster.channel(addr).await, create).await
}

async fn watch_on(channel: Channel, create: WatchCreateRequest) -> tonic::Streaming<WatchResponse> {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(WatchRequest { request_union: Some(watch_request::RequestUnion::CreateRequest(create)) }).await.unwrap();
    // Keep the request side open for the life of the test.
    std::mem::forget(tx);
    let mut stream =
        WatchClient::new(channel).watch(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
    let created = stream.message().await.unwrap().unwrap();
    assert!(created.created);
    stream
}

fn put(key: &str, value: &str) -> PutRequest {
    PutRequest { key: key.into(), value: value.into(), ..Default::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_through_a_follower_are_read_linearizably_on_the_other() {
    let cluster = InProcessCluster::spawn(3).await;
    let (a, b) = cluster.follower_clients().await;
    let mut ka = KvClient::new(cluster.channel(&a).await);
    let mut kb = KvClient::new(cluster.channel(&b).await);
    for i in 0..50 {
        let r = ka.put(put("lin", &i.to_string())).await.unwrap().into_inner();
        // A linearizable read on another follower sees the write at once.
        let got = kb.range(RangeRequest { key: "lin".into(), ..Default::default() }).await.unwrap().into_inner();
        assert_eq!(got.kvs[0].value, i.to_string().into_bytes());
        assert!(got.header.unwrap().revision >= r.header.unwrap().revision);
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_on_one_member_sees_writes_made_through_another() {
    let cluster = InProcessCluster::spawn(3).await;
    let (a, b) = cluster.follower_clients().await;
    let mut stream =
        watch(&cluster, &a, WatchCreateRequest { key: "/x/".into(), range_end: "/x0".into(), ..Default::default() })
            .await;
    let mut kb = KvClient::new(cluster.channel(&b).await);
    let mut revisions = Vec::new();
    for i in 0..20 {
        revisions.push(kb.put(put(&format!("/x/{i}"), "v")).await.unwrap().into_inner().header.unwrap().revision);
    }
    let mut seen = Vec::new();
    while seen.len() < 20 {
        let r = tokio::time::timeout(Duration::from_secs(5), stream.message()).await.unwrap().unwrap().unwrap();
        seen.extend(r.events.iter().map(|e| e.kv.as_ref().unwrap().mod_revision));
    }
    assert_eq!(seen, revisions);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_only_progress_notify_and_history_work_over_grpc() {
    let cluster = InProcessCluster::spawn(3).await;
    let (a, _) = cluster.follower_clients().await;
    let mut kv = KvClient::new(cluster.channel(&a).await);
    for v in ["1", "2", "3"] {
        kv.put(put("/h/key", v)).await.unwrap();
    }
    kv.put(put("/h/other", "x")).await.unwrap();
    let r = kv
        .range(RangeRequest { key: "/h/".into(), range_end: "/h0".into(), count_only: true, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.count, r.kvs.len()), (2, 0));

    let history = ControlClient::new(cluster.channel(&a).await)
        .history(HistoryRequest { key: "/h/key".into(), serializable: false })
        .await
        .unwrap()
        .into_inner();
    let values: Vec<Vec<u8>> = history.entries.iter().map(|e| e.kv.clone().unwrap().value).collect();
    assert_eq!(values, [b"1".to_vec(), b"2".to_vec(), b"3".to_vec()]);
    assert!(history.entries.iter().all(|e| e.commit_time_ms > 0));

    // A quiet watcher that asked for progress hears the current revision.
    let current = r.header.unwrap().revision;
    let mut stream =
        watch(&cluster, &a, WatchCreateRequest { key: "/quiet".into(), progress_notify: true, ..Default::default() })
            .await;
    let p = tokio::time::timeout(Duration::from_secs(5), stream.message()).await.unwrap().unwrap().unwrap();
    assert!(p.events.is_empty() && !p.created && !p.canceled);
    assert_eq!(p.header.unwrap().revision, current);
    cluster.shutdown().await;
}

/// A plain HTTP/1.0 GET; returns the whole response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readiness_and_metrics_are_served_over_http() {
    let cluster = InProcessCluster::spawn(3).await;
    let leader = cluster.must_leader().await as usize;
    let mut kv = KvClient::new(cluster.channel(&cluster.clients[leader - 1]).await);
    for i in 0..10 {
        kv.put(put(&format!("m{i}"), "v")).await.unwrap();
    }
    let resources =
        skiff_client::Client::connect(&[cluster.clients[leader - 1].clone()], None, Some(cluster.connector())).unwrap();
    let namespaces = skiff_api::resources::of(skiff_api::Kind::Namespace);
    resources.list(namespaces, "", &Default::default()).await.unwrap();
    let http = &cluster.https[leader - 1];
    assert!(cluster.http_get(http, "/healthz").await.starts_with("HTTP/1.0 200"));
    assert!(cluster.http_get(http, "/readyz").await.starts_with("HTTP/1.0 200"));
    let metrics = cluster.http_get(http, "/metrics").await;
    for name in [
        "skiff_raft_is_leader 1",
        "skiff_mvcc_revision ",
        "skiff_apiserver_requests_total{code=\"200\",resource=\"namespaces\",verb=\"list\"}",
        "skiff_apiserver_request_duration_seconds_bucket",
        "skiff_proposals_committed_total",
        "skiff_batch_size_bucket",
        "skiff_log_fsync_duration_seconds_bucket",
        "skiff_apply_duration_seconds_count",
        "skiff_raft_leader_changes_total",
        "skiff_leases 0",
    ] {
        assert!(metrics.contains(name), "{name} missing from:\n{metrics}");
    }
    let value = |name: &str| -> f64 {
        let line = metrics.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap();
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert!(value("skiff_batch_size_count") >= 1.0, "batches were observed");
    assert!(value("skiff_batch_size_sum") >= 10.0, "every write was counted in a batch");
    // Background writers (leases, the endpoint reconciler) may have a proposal in flight at
    // any moment; what must hold is that none is left pending for good.
    let mut pending = value("skiff_proposals_pending");
    for _ in 0..50 {
        if pending == 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let again = cluster.http_get(http, "/metrics").await;
        let line = again.lines().find(|l| l.starts_with("skiff_proposals_pending ")).unwrap();
        pending = line.rsplit(' ').next().unwrap().parse().unwrap();
    }
    assert_eq!(pending, 0.0, "a proposal stayed pending");
    let revision = cluster.store(leader as u64).revision();
    assert!(value("skiff_mvcc_revision") >= 10.0 && value("skiff_mvcc_revision") <= revision as f64);
    assert!(value("skiff_log_fsync_duration_seconds_count") >= 1.0);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_that_stops_reading_falls_behind_and_still_gets_every_revision() {
    let cluster = InProcessCluster::spawn(3).await;
    let (a, b) = cluster.follower_clients().await;
    // Created, then not read while far more revisions than any queue holds go by.
    let mut stream = watch(
        &cluster,
        &a,
        WatchCreateRequest { key: "/slow/".into(), range_end: "/slow0".into(), ..Default::default() },
    )
    .await;
    let mut kb = KvClient::new(cluster.channel(&b).await);
    let writes = 3000;
    let mut tasks = Vec::new();
    for w in 0..8 {
        let mut kb = kb.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..writes / 8 {
                kb.put(put(&format!("/slow/{w}/{i}"), "v")).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let last = kb.put(put("/slow/last", "v")).await.unwrap().into_inner().header.unwrap().revision;
    let mut seen = Vec::new();
    while seen.last().copied() != Some(last) {
        let r = tokio::time::timeout(Duration::from_secs(10), stream.message()).await.unwrap().unwrap().unwrap();
        assert!(!r.canceled, "{}", r.cancel_reason);
        seen.extend(r.events.iter().map(|e| e.kv.as_ref().unwrap().mod_revision));
    }
    assert_eq!(seen.len(), writes + 1);
    assert!(seen.windows(2).all(|w| w[1] == w[0] + 1), "revisions delivered in order, each once, no gaps");
    cluster.shutdown().await;
}

/// Sends a plain HTTP/1.0 GET and reads the response head; the body is
/// left on the returned stream.
/// How a server stream ended: its status code and message.
async fn stream_end<T>(stream: &mut tonic::Streaming<T>) -> (tonic::Code, String) {
    match tokio::time::timeout(Duration::from_secs(10), stream.message()).await {
        Ok(Err(status)) => (status.code(), status.message().to_string()),
        Ok(Ok(Some(_))) => panic!("the stream went on"),
        Ok(Ok(None)) => panic!("the stream ended without a status"),
        Err(_) => panic!("the stream is still open"),
    }
}

/// A stopping member ends its long-lived client streams rather than leave
/// them open until the process exits: etcd watches and lease keep-alives
/// end with etcd's Unavailable "server stopped" (etcd clients then go to
/// another member), and a Kubernetes watch response simply ends, as when
/// its `timeoutSeconds` runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_member_ends_its_watches_and_keep_alives() {
    use tokio::io::AsyncReadExt;
    let mut cluster = InProcessCluster::spawn(3).await;
    let (addr, http) = (cluster.clients[0].clone(), cluster.https[0].clone());
    let mut etcd_watch = watch(&cluster, &addr, WatchCreateRequest { key: "/w".into(), ..Default::default() }).await;
    let mut lease = LeaseClient::new(cluster.channel(&addr).await);
    let id = lease.lease_grant(LeaseGrantRequest { ttl: 60, id: 0 }).await.unwrap().into_inner().id;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(LeaseKeepAliveRequest { id }).await.unwrap();
    let mut keep_alive =
        lease.lease_keep_alive(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
    assert_eq!(keep_alive.message().await.unwrap().unwrap().id, id);
    let (mut rest_watch, head) = cluster.http_open(&http, "/api/v1/namespaces/default/configmaps?watch=true").await;
    assert!(head.starts_with("HTTP/1.0 200"), "{head}");

    cluster.stop(1).await.unwrap();

    for ended in [stream_end(&mut etcd_watch).await, stream_end(&mut keep_alive).await] {
        assert_eq!(ended, (tonic::Code::Unavailable, "etcdserver: server stopped".to_string()));
    }
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), rest_watch.read_to_end(&mut rest)).await;
    assert!(matches!(read, Ok(Ok(_))), "the Kubernetes watch response did not end: {read:?}");
    drop(tx);
    cluster.shutdown().await;
}

/// Writes and calls a follower has sent on to the leader, from `/metrics`.
async fn forward_batches(cluster: &InProcessCluster, http: &str) -> (f64, f64) {
    let metrics = cluster.http_get(http, "/metrics").await;
    let value = |name: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{name}"))
    };
    (value("skiff_forward_batch_size_sum "), value("skiff_forward_batch_size_count "))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_carries_hundreds_of_concurrent_calls_and_watches() {
    let cluster = InProcessCluster::spawn(3).await;
    let leader = (cluster.must_leader().await - 1) as usize;
    let follower = (0..3).find(|&i| i != leader).unwrap();
    for member in [leader, follower] {
        let addr = cluster.clients[member].clone();
        let forwarded_before = forward_batches(&cluster, &cluster.https[member]).await;
        // One HTTP/2 connection; more streams than hyper's default limit
        // of 200 concurrent streams, which a server must not impose.
        let shared = cluster.channel(&addr).await;
        let key = format!("/many/{addr}/watched");
        let mut watches = Vec::new();
        for i in 0..300 {
            let create = WatchCreateRequest { key: key.clone().into(), ..Default::default() };
            let created = tokio::time::timeout(Duration::from_secs(10), watch_on(shared.clone(), create)).await;
            watches.push(created.unwrap_or_else(|_| panic!("watch {i} was never created on the shared connection")));
        }
        let puts = (0..300).map(|i| {
            let mut kv = KvClient::new(shared.clone());
            let key = format!("/many/{addr}/{i}");
            async move { kv.put(put(&key, "v")).await.unwrap().into_inner().header.unwrap().revision }
        });
        let revisions: std::collections::BTreeSet<i64> = futures::future::join_all(puts).await.into_iter().collect();
        assert_eq!(revisions.len(), 300, "every concurrent put has a revision of its own");
        if member == follower {
            // The follower sent them on to the leader in fewer calls than
            // writes. (The registry is shared by this binary's tests; theirs
            // add as many writes as calls or more, never fewer.)
            let (writes, calls) = forward_batches(&cluster, &cluster.https[member]).await;
            let (writes, calls) = (writes - forwarded_before.0, calls - forwarded_before.1);
            assert!(writes >= 300.0 && calls < writes, "{calls} forward calls for {writes} writes");
        }

        let written = KvClient::new(shared.clone()).put(put(&key, "seen")).await.unwrap().into_inner();
        let revision = written.header.unwrap().revision;
        for (i, w) in watches.iter_mut().enumerate() {
            let Ok(got) = tokio::time::timeout(Duration::from_secs(10), w.message()).await else {
                panic!("watch {i} saw nothing");
            };
            let got = got.unwrap().unwrap();
            assert_eq!(got.events.len(), 1, "watch {i}: {got:?}");
            assert_eq!(got.events[0].kv.as_ref().unwrap().mod_revision, revision, "watch {i}");
        }
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_ends_at_its_grpc_timeout_with_deadline_exceeded() {
    use http_body_util::BodyExt;
    use prost::Message;

    let mut cluster = InProcessCluster::spawn(3).await;
    let addr = cluster.clients[0].clone();
    // Without a quorum a put is retried until the member's own request
    // timeout (10 s); the caller's 300 ms deadline must end it first.
    for id in [2, 3] {
        cluster.stop(id).await.unwrap();
    }
    // A raw HTTP/2 call, because tonic's client would give up on its own at
    // the same deadline and hide what the server answers.
    let uri: hyper::Uri = format!("https://{addr}").parse().unwrap();
    let io = tower::ServiceExt::oneshot(cluster.connector(), uri).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io).await.unwrap();
    tokio::spawn(conn);
    let message = put("/deadline", "v").encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(&message);
    let request = hyper::Request::post(format!("https://{addr}/etcdserverpb.KV/Put"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", "300m")
        .body(http_body_util::Full::new(hyper::body::Bytes::from(framed)))
        .unwrap();
    let started = std::time::Instant::now();
    let response = tokio::time::timeout(Duration::from_secs(5), sender.send_request(request))
        .await
        .expect("the server ignored the caller's deadline")
        .unwrap();
    let elapsed = started.elapsed();
    let (parts, body) = response.into_parts();
    let trailers = body.collect().await.unwrap().trailers().cloned();
    let status = parts.headers.get("grpc-status").or_else(|| trailers.as_ref()?.get("grpc-status"));
    assert_eq!(status.map(|s| s.to_str().unwrap()), Some("4"), "{parts:?} {trailers:?}");
    assert!(elapsed >= Duration::from_millis(300), "{elapsed:?}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_snapshot_after_enough_bytes_of_log_however_few_entries() {
    let cluster = InProcessCluster::spawn_configured(3, |store| {
        store.snapshot_logs = 1_000_000;
        store.snapshot_log_bytes = 1 << 20;
    })
    .await;
    let mut kv = KvClient::new(cluster.channel(&cluster.clients[0]).await);
    let value = "x".repeat(60 * 1024);
    let snapshotted = |cluster: &InProcessCluster| cluster.stores().all(|store| store.status().snapshot_index > 0);
    // Far fewer entries than `snapshot_logs`, but (with the database's own
    // size, which also counts) tens of megabytes of them.
    let mut written = 0;
    while !snapshotted(&cluster) && written < 1500 {
        kv.put(put(&format!("big/{}", written % 100), &value)).await.unwrap();
        written += 1;
        if written % 100 == 0 {
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    for _ in 0..100 {
        if snapshotted(&cluster) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(snapshotted(&cluster), "no snapshot on every member after {written} writes of 60 KiB");
    cluster.shutdown().await;
}
