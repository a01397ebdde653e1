//! Real-process cluster tests: bootstrap, leader kills under load with a
//! resuming watcher, restart and catch-up, join and removal, refusals.
//! The members run secured as `skiff up` runs them (TLS on every port,
//! mutual TLS between peers), so joins and snapshots cross it too.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use skiff_proto::etcdserverpb::kv_client::KvClient;
use skiff_proto::etcdserverpb::watch_client::WatchClient;
use skiff_proto::etcdserverpb::{watch_request, PutRequest, RangeRequest, WatchCreateRequest, WatchRequest};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_members_bootstrap_and_agree_on_one_leader() {
    let cluster = Cluster::spawn_with(5, &[]).await;
    let leader = cluster.must_leader().await;
    assert!((1..=5).contains(&leader));
    let out = must_succeed(cluster.etcdctl(&cluster.endpoints(), &["member", "list"]));
    assert_eq!(out.lines().count(), 5, "{out}");
}

/// A write through a follower is answered once the follower has applied
/// it, so a serializable read there straight after sees it (etcd's members
/// give their clients that; the apiserver's read-modify-writes rely on it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_serves_its_own_writes_to_serializable_reads() {
    let cluster = Cluster::spawn(3).await;
    let leader = cluster.must_leader().await;
    let follower = cluster.running().find(|m| m.id != leader).unwrap().client.clone();
    let mut kv = cluster.kv(&follower).await;
    for i in 0..200 {
        let key = format!("/own/{i}").into_bytes();
        let put = PutRequest { key: key.clone(), value: b"v".to_vec(), ..Default::default() };
        let written = kv.put(put).await.unwrap().into_inner().header.unwrap().revision;
        let read = RangeRequest { key, serializable: true, ..Default::default() };
        let got = kv.range(read).await.unwrap().into_inner();
        assert_eq!(got.kvs.len(), 1, "write {i} at revision {written} is not visible on the member it went through");
        assert_eq!(got.kvs[0].mod_revision, written);
    }
}

/// One acknowledged write: its key and the revision the cluster gave it.
#[derive(Clone, Debug)]
struct Acked {
    key: String,
    revision: i64,
}

/// Writes unique keys through changing members until `stop`; a write whose
/// outcome is unknown (error) is never retried under the same key.
async fn writer(
    endpoints: Vec<String>,
    tls: Option<skiff_pki::Connector>,
    w: usize,
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<Acked>>>,
) {
    let mut seq = 0u64;
    let mut target = w;
    let mut last_rev = 0;
    while !stop.load(Ordering::Relaxed) {
        let addr = &endpoints[target % endpoints.len()];
        let Ok(ch) = connect(addr, tls.as_ref()).await else {
            target += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let mut kv = skiff_proto::etcdserverpb::kv_client::KvClient::new(ch);
        while !stop.load(Ordering::Relaxed) {
            seq += 1;
            let key = format!("/chaos/w{w}/{seq:08}");
            let mut req = tonic::Request::new(PutRequest {
                key: key.clone().into_bytes(),
                value: format!("v{seq}").into_bytes(),
                ..Default::default()
            });
            req.set_timeout(Duration::from_secs(5));
            match kv.put(req).await {
                Ok(r) => {
                    let revision = r.into_inner().header.unwrap().revision;
                    assert!(revision > last_rev, "writer {w}: revision {revision} after {last_rev}");
                    last_rev = revision;
                    acked.lock().unwrap().push(Acked { key, revision });
                }
                Err(_) => {
                    target += 1;
                    break;
                }
            }
        }
    }
}

/// Watches `/chaos/` from revision 1, resuming from the last revision seen
/// on another member whenever the stream breaks. Returns (revision, key) of
/// every event.
async fn resuming_watcher(
    endpoints: Vec<String>,
    tls: Option<skiff_pki::Connector>,
    stop: Arc<AtomicBool>,
) -> Vec<(i64, String)> {
    let mut events: Vec<(i64, String)> = Vec::new();
    let mut target = 0;
    while !stop.load(Ordering::Relaxed) {
        let start = events.last().map_or(1, |(r, _)| r + 1);
        let addr = &endpoints[target % endpoints.len()];
        target += 1;
        let Ok(ch) = connect(addr, tls.as_ref()).await else { continue };
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.send(WatchRequest {
            request_union: Some(watch_request::RequestUnion::CreateRequest(WatchCreateRequest {
                key: b"/chaos/".to_vec(),
                range_end: b"/chaos0".to_vec(),
                start_revision: start,
                ..Default::default()
            })),
        })
        .await
        .unwrap();
        let Ok(resp) = WatchClient::new(ch).watch(tokio_stream::wrappers::ReceiverStream::new(rx)).await else {
            continue;
        };
        let mut stream = resp.into_inner();
        loop {
            let next = tokio::time::timeout(Duration::from_millis(500), stream.message()).await;
            match next {
                Ok(Ok(Some(r))) => {
                    assert!(!r.canceled, "watch canceled: {}", r.cancel_reason);
                    for e in r.events {
                        let kv = e.kv.unwrap();
                        events.push((kv.mod_revision, String::from_utf8(kv.key).unwrap()));
                    }
                }
                Ok(_) => break,
                Err(_) if stop.load(Ordering::Relaxed) => return events,
                Err(_) => {}
            }
        }
        drop(tx);
    }
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_kills_under_load_lose_no_acknowledged_write() {
    let kills: usize = std::env::var("SKIFF_CHAOS_KILLS").ok().and_then(|s| s.parse().ok()).unwrap_or(3);
    let mut cluster = Cluster::spawn_with(3, &[]).await;
    let endpoints: Vec<String> = cluster.running().map(|m| m.client.clone()).collect();
    let tls = cluster.client_tls.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Vec::new()));
    let writers: Vec<_> =
        (0..4).map(|w| tokio::spawn(writer(endpoints.clone(), tls.clone(), w, stop.clone(), acked.clone()))).collect();
    let watcher = tokio::spawn(resuming_watcher(endpoints.clone(), tls.clone(), stop.clone()));

    for _ in 0..kills {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let leader = cluster.must_leader().await;
        cluster.kill(leader);
        let before = acked.lock().unwrap().len();
        // Writes resume under a new leader.
        let new_leader = cluster.must_leader().await;
        assert_ne!(new_leader, leader);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while acked.lock().unwrap().len() < before + 20 {
            assert!(std::time::Instant::now() < deadline, "writes did not resume after killing {leader}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // The killed member restarts on its data dir and rejoins.
        cluster.start(leader);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    let events = watcher.await.unwrap();
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() > 100, "only {} writes acknowledged", acked.len());

    // Every acknowledged write is stored at the revision it was given.
    let leader = cluster.must_leader().await;
    let mut kv = cluster.kv(&cluster.members[&leader].client).await;
    let all = kv
        .range(RangeRequest { key: b"/chaos/".to_vec(), range_end: b"/chaos0".to_vec(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    let stored: BTreeMap<String, i64> =
        all.kvs.iter().map(|kv| (String::from_utf8(kv.key.clone()).unwrap(), kv.mod_revision)).collect();
    // Each key was written once by its writer: a version above 1 would be a
    // write applied twice (a forwarded or batched retry that slipped past
    // the request-id check).
    for kv in &all.kvs {
        assert_eq!(kv.version, 1, "{} applied {} times", String::from_utf8_lossy(&kv.key), kv.version);
    }
    for a in &acked {
        assert_eq!(stored.get(&a.key), Some(&a.revision), "acknowledged write {a:?} lost or moved");
    }

    // The resuming watcher saw each revision once, in order, with no gaps.
    for pair in events.windows(2) {
        assert!(pair[1].0 > pair[0].0, "watch revisions not strictly increasing: {pair:?}");
    }
    let seen: BTreeSet<i64> = events.iter().map(|(r, _)| *r).collect();
    let (first, last) = (*seen.first().unwrap(), *seen.last().unwrap());
    // Every /chaos/ key is written once, so its mod revision is its write:
    // the watch has each one in its window (other revisions, such as the
    // default namespaces a master creates at start, are not /chaos/ writes).
    let written: BTreeSet<i64> = all.kvs.iter().map(|kv| kv.mod_revision).collect();
    let missing: Vec<&i64> = written.range(first..=last).filter(|r| !seen.contains(r)).collect();
    assert!(missing.is_empty(), "the watch skipped revisions {missing:?} between {first} and {last}");
    let invented: Vec<&i64> = seen.difference(&written).collect();
    assert!(invented.is_empty(), "the watch delivered revisions no /chaos/ write made: {invented:?}");
    let watched: BTreeSet<&str> = events.iter().map(|(_, k)| k.as_str()).collect();
    for a in &acked {
        if a.revision <= last {
            assert!(watched.contains(a.key.as_str()), "watcher missed acknowledged write {a:?}");
        }
    }

    // Every member, including the restarted ones, catches up.
    let expected = all.header.unwrap().revision;
    let running: Vec<u64> = cluster.running().map(|m| m.id).collect();
    for id in running {
        cluster.must_catch_up(id, expected, Duration::from_secs(30)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_join_and_leave_a_running_cluster() {
    let mut cluster = Cluster::spawn_with(3, &[]).await;
    let mut kv1 = cluster.kv(&cluster.members[&1].client).await;
    kv1.put(PutRequest { key: b"before-join".to_vec(), value: b"x".to_vec(), ..Default::default() }).await.unwrap();
    let join = cluster.members[&1].client.clone();
    for id in [4, 5] {
        cluster.add_member(id);
        cluster.start_with(id, &["--join", &join, "--join-timeout", "30s"]);
    }
    // Both joiners become voters and serve the data written before they joined.
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    loop {
        let out = stdout(&cluster.etcdctl(&join, &["member", "list"]));
        let voters = out.lines().filter(|l| l.contains("false")).count();
        if voters == 5 && out.lines().count() == 5 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "joiners not promoted: {out}\n{}", cluster.log_of(4));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let out = must_succeed(cluster.etcdctl(&cluster.members[&5].client, &["get", "before-join", "--consistency=s"]));
    assert!(out.contains("before-join"), "{out}");

    // Remove member 2; the others keep working.
    must_succeed(cluster.etcdctl(&join, &["member", "remove", "2"]));
    cluster.kill(2);
    let out = must_succeed(cluster.etcdctl(&join, &["member", "list"]));
    assert_eq!(out.lines().count(), 4, "{out}");
    must_succeed(cluster.etcdctl(&cluster.endpoints(), &["put", "after-remove", "y"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_member_is_refused_instead_of_rejoining_under_its_old_id() {
    let mut cluster = Cluster::spawn_with(3, &[]).await;
    // Wait until member 3 has published itself.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let out = stdout(&cluster.etcdctl(&cluster.endpoints(), &["member", "list"]));
        if out.lines().filter(|l| l.contains("member-")).count() == 3 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "members never published: {out}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    cluster.kill(3);
    cluster.wipe(3);
    let initial = cluster.initial.clone();
    let flags = cluster.extra_args.clone();
    let args: Vec<&str> = ["--initial-cluster", &initial].into_iter().chain(flags.iter().map(String::as_str)).collect();
    let out = cluster.run_to_exit(3, &args);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("already belongs to the running cluster"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_that_is_not_skiffs_is_refused_untouched() {
    let mut cluster = Cluster {
        root: tempfile::tempdir().unwrap(),
        members: BTreeMap::new(),
        initial: String::new(),
        extra_args: Vec::new(),
        client_tls: None,
        pki: None,
    };
    cluster.add_member(1);
    let dir = cluster.members[&1].data_dir.clone();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("precious.txt"), "keep me").unwrap();
    let initial = format!("1={}", cluster.members[&1].peer);
    let out = cluster.run_to_exit(1, &["--initial-cluster", &initial]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a Skiff data directory"), "{err}");
    assert_eq!(std::fs::read_to_string(dir.join("precious.txt")).unwrap(), "keep me");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
}

/// Keys under `prefix` (which ends in '/') in the member's own state.
async fn local_count(cluster: &Cluster, addr: &str, prefix: &str) -> i64 {
    let end = format!("{}0", prefix.trim_end_matches('/'));
    let range = RangeRequest {
        key: prefix.as_bytes().to_vec(),
        range_end: end.into_bytes(),
        serializable: true,
        count_only: true,
        ..Default::default()
    };
    cluster.kv(addr).await.range(range).await.unwrap().into_inner().count
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_missed_the_purged_log_catches_up_from_a_snapshot() {
    let mut cluster = Cluster::spawn_with(3, &["--snapshot-count", "50"]).await;
    let leader = cluster.must_leader().await;
    let lagging = cluster.members.keys().copied().find(|id| *id != leader).unwrap();
    cluster.kill(lagging);
    let lagging_at = cluster.gauge(leader, "skiff_raft_last_log_index").expect("the leader serves /metrics");
    let mut kv = cluster.kv(&cluster.members[&leader].client).await;
    let mut last = 0;
    for i in 0..400 {
        let put =
            PutRequest { key: format!("/snap/{i:04}").into_bytes(), value: vec![b'x'; 512], ..Default::default() };
        last = kv.put(put).await.unwrap().into_inner().header.unwrap().revision;
    }
    // The leader has snapshotted and purged the entries the lagging member lacks.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !cluster.has_snapshot(leader) {
        assert!(std::time::Instant::now() < deadline, "leader built no snapshot:\n{}", cluster.log_of(leader));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Restarted before the purge, the member once caught up from the
    // entries themselves.
    cluster.must_purge_past(leader, lagging_at, Duration::from_secs(20)).await;
    cluster.start(lagging);
    let addr = cluster.members[&lagging].client.clone();
    cluster.must_catch_up(lagging, last, Duration::from_secs(30)).await;
    assert!(cluster.installed_snapshot(lagging), "caught up without a snapshot:\n{}", cluster.log_of(lagging));
    // Its local (serializable) reads see every key.
    assert_eq!(local_count(&cluster, &addr, "/snap/").await, 400);
    // Writes keep flowing to it after the install.
    must_succeed(cluster.etcdctl(&addr, &["put", "/snap/after", "y"]));
    let out = must_succeed(cluster.etcdctl(&addr, &["get", "/snap/after", "--consistency=s"]));
    assert!(out.contains("y"));
}

/// Bytes of packed snapshot files (`*.snap`) in a member's snapshot directory.
fn snap_bytes(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "snap"))
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum()
}

/// Issue 3's large-state case: a member that was down while 200 MB were
/// written (and the log purged) catches up by a streamed snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_catches_up_on_200_mb_by_snapshot() {
    let megabytes: usize = std::env::var("SKIFF_SNAPSHOT_MB").ok().and_then(|s| s.parse().ok()).unwrap_or(200);
    // Entries carry up to 4 MiB of batched writes: a snapshot (and purge)
    // every 30 entries happens at least once during the load.
    let mut cluster = Cluster::spawn_with(3, &["--snapshot-count", "30"]).await;
    let leader = cluster.must_leader().await;
    let lagging = cluster.members.keys().copied().find(|id| *id != leader).unwrap();
    cluster.kill(lagging);
    let value_size = 512 * 1024;
    let count = megabytes * 1024 * 1024 / value_size;
    let leader_client = cluster.members[&leader].client.clone();
    let mut tasks = Vec::new();
    for w in 0..8 {
        let addr = leader_client.clone();
        let tls = cluster.client_tls.clone();
        tasks.push(tokio::spawn(async move {
            let mut kv = KvClient::new(connect(&addr, tls.as_ref()).await.unwrap());
            let mut last = 0;
            for i in (w..count).step_by(8) {
                // Incompressible, so the state really is this large on disk.
                let value: Vec<u8> = (0..value_size).map(|_| rand::random::<u8>()).collect();
                let put = PutRequest { key: format!("/big/{i:06}").into_bytes(), value, ..Default::default() };
                last = last.max(kv.put(put).await.unwrap().into_inner().header.unwrap().revision);
            }
            last
        }));
    }
    let mut last = 0;
    for t in tasks {
        last = last.max(t.await.unwrap());
    }
    // Writes of 512 KiB batch eight to an entry, so the load is only some
    // 50 entries: small writes (an entry each) carry the log past the next
    // snapshot point, until the leader's snapshot holds all of the data.
    let wanted = (megabytes as u64) * 1024 * 1024 * 9 / 10;
    let leader_snapshots = cluster.members[&leader].data_dir.join("snapshots");
    let mut kv_leader = cluster.kv(&leader_client).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let mut filler = 0;
    while snap_bytes(&leader_snapshots) <= wanted {
        assert!(std::time::Instant::now() < deadline, "the leader never snapshotted the whole load");
        let put =
            PutRequest { key: format!("/filler/{filler}").into_bytes(), value: b"x".to_vec(), ..Default::default() };
        last = last.max(kv_leader.put(put).await.unwrap().into_inner().header.unwrap().revision);
        filler += 1;
        if filler % 10 == 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    cluster.start(lagging);
    let addr = cluster.members[&lagging].client.clone();
    cluster.must_catch_up(lagging, last, Duration::from_secs(180)).await;
    let installed = snap_bytes(&cluster.members[&lagging].data_dir.join("snapshots"));
    assert!(installed > wanted, "installed snapshot is only {installed} bytes");
    assert_eq!(local_count(&cluster, &addr, "/big/").await as usize, count);
}
