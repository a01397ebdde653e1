//! Faults injected into an in-process cluster: a partition through the peer
//! transport's filter, and a member killed and restarted on its data dir.
//! Every wait is a bounded poll; nothing asserts how fast a step was.

use std::time::Duration;

use skiff_proto::etcdserverpb::kv_client::KvClient;
use skiff_proto::etcdserverpb::{PutRequest, RangeRequest};
use skiff_testing::{must_eventually, InProcessCluster};
use tonic::transport::Channel;

/// How long a member may take to serve what the majority wrote: generous,
/// for slow and shared machines.
const CATCH_UP_WITHIN: Duration = Duration::from_secs(60);

/// A member's client port, reached as the cluster's administrator.
struct Member {
    addr: String,
    channel: Channel,
}

fn member(cluster: &InProcessCluster, id: u64) -> Member {
    let addr = cluster.client(id).to_string();
    let endpoint = cluster.endpoint(&addr).connect_timeout(Duration::from_secs(2));
    Member { channel: endpoint.connect_with_connector_lazy(cluster.connector()), addr }
}

fn kv(m: &Member) -> KvClient<Channel> {
    KvClient::new(m.channel.clone())
}

async fn put(m: &Member, key: &str, value: &str) -> Result<i64, tonic::Status> {
    let request = PutRequest { key: key.into(), value: value.into(), ..Default::default() };
    let response = kv(m).put(request).await?.into_inner();
    Ok(response.header.expect("a header").revision)
}

/// A linearizable read of the keys under `prefix`, as (key, value) pairs,
/// within `timeout`.
async fn read(m: &Member, prefix: &str, timeout: Duration) -> Result<Vec<(String, String)>, tonic::Status> {
    let mut end = prefix.as_bytes().to_vec();
    *end.last_mut().expect("a non-empty prefix") += 1;
    let mut request = tonic::Request::new(RangeRequest { key: prefix.into(), range_end: end, ..Default::default() });
    request.set_timeout(timeout);
    let response = kv(m).range(request).await?.into_inner();
    let text = |b: Vec<u8>| String::from_utf8(b).expect("utf-8");
    Ok(response.kvs.into_iter().map(|kv| (text(kv.key), text(kv.value))).collect())
}

/// Waits until member `m` serves exactly `expected` under `prefix`
/// through a linearizable read.
async fn must_serve(m: &Member, prefix: &str, expected: &[(String, String)]) {
    must_eventually(
        &format!("{} serves {} keys under {prefix}", m.addr, expected.len()),
        CATCH_UP_WITHIN,
        || async move {
            match read(m, prefix, Duration::from_secs(5)).await {
                Ok(seen) if seen == expected => Ok(()),
                Ok(seen) => Err(format!("read {seen:?}")),
                Err(status) => Err(format!("read failed: {status}")),
            }
        },
    )
    .await;
}

/// Writes `key=value` through `m`, retrying while the cluster has no
/// leader it can reach (as a client would).
async fn must_put(m: &Member, key: &str, value: &str) -> i64 {
    must_eventually(&format!("put {key} through {}", m.addr), CATCH_UP_WITHIN, || put(m, key, value)).await
}

fn pair(key: &str, value: &str) -> (String, String) {
    (key.to_string(), value.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_leader_loses_to_the_majority_and_serves_its_writes_after_the_heal() {
    // A write waits at most this long in the store, across leader changes.
    let request_timeout = Duration::from_secs(3);
    let mut cluster = InProcessCluster::spawn_configured(3, |store| store.request_timeout = request_timeout).await;
    let old = cluster.must_leader().await;
    let majority: Vec<u64> = cluster.ids().into_iter().filter(|id| *id != old).collect();
    must_put(&member(&cluster, old), "/p/before", "1").await;

    cluster.partition(&[old], &majority);
    let new = cluster.must_leader_of(&majority).await;
    assert_ne!(new, old, "the majority elected a leader of its own");

    // A write through the isolated old leader is never acknowledged: it
    // cannot reach a quorum. The client gives up after longer than the
    // store retries a write, so the write cannot go through after the heal.
    let isolated = tokio::time::timeout(request_timeout * 2, put(&member(&cluster, old), "/p/isolated", "lost")).await;
    assert!(!matches!(isolated, Ok(Ok(_))), "a write through the isolated leader was acknowledged: {isolated:?}");

    // The majority accepts writes, through its leader and its follower.
    let follower = *majority.iter().find(|id| **id != new).expect("a follower in the majority");
    for (i, id) in [new, follower, new].into_iter().enumerate() {
        must_put(&member(&cluster, id), &format!("/p/during/{i}"), &format!("v{i}")).await;
    }
    // Nor does the isolated old leader serve a linearizable read: it cannot
    // know the majority's writes.
    let stale = read(&member(&cluster, old), "/p/", Duration::from_secs(2)).await;
    assert!(stale.is_err(), "the isolated leader served a linearizable read: {stale:?}");

    cluster.heal();
    // Its log lacks the majority's entries: it cannot win an election.
    let leader = cluster.must_leader().await;
    assert!(majority.contains(&leader), "the old leader {old} rejoined as a follower, not as leader {leader}");
    let expected =
        [pair("/p/before", "1"), pair("/p/during/0", "v0"), pair("/p/during/1", "v1"), pair("/p/during/2", "v2")];
    for id in cluster.ids() {
        must_serve(&member(&cluster, id), "/p/", &expected).await;
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_follower_restarts_on_its_data_and_catches_up_with_the_writes_it_missed() {
    let mut cluster = InProcessCluster::spawn(3).await;
    let leader = cluster.must_leader().await;
    let followers = cluster.followers().await;
    let (killed, other) = (followers[0], followers[1]);
    let mut expected = Vec::new();
    for i in 0..5 {
        must_put(&member(&cluster, leader), &format!("/k/{i:02}"), "before").await;
        expected.push(pair(&format!("/k/{i:02}"), "before"));
    }
    must_serve(&member(&cluster, killed), "/k/", &expected).await;

    cluster.kill(killed).await;
    // Two members of three are a quorum: writes go on, through the leader
    // and forwarded by the other follower.
    for i in 5..20 {
        let through = if i % 2 == 0 { leader } else { other };
        must_put(&member(&cluster, through), &format!("/k/{i:02}"), "while down").await;
        expected.push(pair(&format!("/k/{i:02}"), "while down"));
    }
    must_serve(&member(&cluster, other), "/k/", &expected).await;

    cluster.restart(killed).await;
    must_serve(&member(&cluster, killed), "/k/", &expected).await;
    // It takes writes again, too.
    must_put(&member(&cluster, killed), "/k/20", "after").await;
    expected.push(pair("/k/20", "after"));
    for id in cluster.ids() {
        must_serve(&member(&cluster, id), "/k/", &expected).await;
    }
    cluster.shutdown().await;
}
