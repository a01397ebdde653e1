//! etcd's Lock and Election services and MoveLeader against a real Skiff
//! cluster: gRPC clients of the services (as etcd's `v3lock`/`v3election`
//! clients call them) contending with each other and with `etcdctl lock` /
//! `etcdctl elect` processes, which use the same keys through KV and Watch;
//! and `etcdctl move-leader` to every other member.

mod support;

use std::process::Child;
use std::time::{Duration, Instant};

use skiff_proto::etcdserverpb::lease_client::LeaseClient;
use skiff_proto::etcdserverpb::{LeaseGrantRequest, LeaseKeepAliveRequest, LeaseRevokeRequest};
use skiff_proto::v3electionpb::election_client::ElectionClient;
use skiff_proto::v3electionpb::{CampaignRequest, LeaderKey, LeaderRequest, ProclaimRequest, ResignRequest};
use skiff_proto::v3lockpb::lock_client::LockClient;
use skiff_proto::v3lockpb::{LockRequest, UnlockRequest};
use support::*;
use tonic::transport::Channel;

async fn lease(cluster: &Cluster, addr: &str, ttl: i64) -> i64 {
    let mut c = LeaseClient::new(cluster.channel(addr).await.unwrap());
    c.lease_grant(LeaseGrantRequest { ttl, id: 0 }).await.unwrap().into_inner().id
}

async fn revoke(cluster: &Cluster, addr: &str, id: i64) {
    let mut c = LeaseClient::new(cluster.channel(addr).await.unwrap());
    c.lease_revoke(LeaseRevokeRequest { id }).await.unwrap();
}

async fn keep_alive_once(cluster: &Cluster, addr: &str, id: i64) {
    let mut c = LeaseClient::new(cluster.channel(addr).await.unwrap());
    let mut replies = c.lease_keep_alive(tokio_stream::once(LeaseKeepAliveRequest { id })).await.unwrap().into_inner();
    let reply = replies.message().await.unwrap().unwrap();
    assert!(reply.ttl > 0, "lease {id:x} is gone");
}

async fn locks(cluster: &Cluster, addr: &str) -> LockClient<Channel> {
    LockClient::new(cluster.channel(addr).await.unwrap())
}

async fn elections(cluster: &Cluster, addr: &str) -> ElectionClient<Channel> {
    ElectionClient::new(cluster.channel(addr).await.unwrap())
}

fn stop_and_read(mut child: Child) -> String {
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// Polls the keys under `prefix` until `check` holds for them.
async fn must_see_keys(cluster: &Cluster, endpoint: &str, prefix: &str, check: impl Fn(&[String]) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = must_succeed(cluster.etcdctl(endpoint, &["get", "--prefix", "--keys-only", prefix]));
        let keys: Vec<String> = out.split_whitespace().map(String::from).collect();
        if check(&keys) {
            return;
        }
        assert!(Instant::now() < deadline, "keys under {prefix} stayed {keys:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_service_hands_the_lock_on_in_order_on_unlock_revoke_and_expiry() {
    let cluster = Cluster::spawn(3).await;
    let leader = cluster.must_leader().await;
    let members: Vec<String> = cluster.members.values().map(|m| m.client.clone()).collect();
    let follower = cluster.members.values().find(|m| m.id != leader).unwrap().client.clone();

    // The first owner holds the lock under a lease it keeps.
    let first = lease(&cluster, &members[0], 60).await;
    let held =
        locks(&cluster, &members[0]).await.lock(LockRequest { name: b"job".to_vec(), lease: first }).await.unwrap();
    let owner_key = held.into_inner().key;
    assert_eq!(owner_key, format!("job/{first:x}").into_bytes());

    // A second gRPC client waits for it, through another member ...
    let second = lease(&cluster, &members[1], 60).await;
    let mut second_client = locks(&cluster, &members[1]).await;
    let waiting =
        tokio::spawn(async move { second_client.lock(LockRequest { name: b"job".to_vec(), lease: second }).await });
    // ... and so does an etcdctl process using the client-side recipe on the
    // same keys, behind it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let etcdctl_lock = cluster.etcdctl_child(&follower, &["lock", "--ttl=3", "job"]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!waiting.is_finished(), "the second client got a held lock");
    must_see_keys(&cluster, &follower, "job/", |keys| keys.len() == 3).await;

    // Unlock hands the lock to the second client, only.
    locks(&cluster, &members[2]).await.unlock(UnlockRequest { key: owner_key }).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("second client locks").unwrap();
    let second_key = got.unwrap().into_inner().key;
    assert_eq!(second_key, format!("job/{second:x}").into_bytes());
    tokio::time::sleep(Duration::from_secs(1)).await;
    must_see_keys(&cluster, &follower, "job/", |keys| keys.len() == 2).await;

    // Revoking the second client's lease hands it to etcdctl.
    revoke(&cluster, &members[0], second).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut etcdctl_lock = Some(etcdctl_lock);
    loop {
        // etcdctl prints the key it holds once it has the lock.
        let out = must_succeed(cluster.etcdctl(&follower, &["get", "--prefix", "--keys-only", "job/"]));
        if out.split_whitespace().count() == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "etcdctl never got the lock: {out}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Killed without unlocking, etcdctl's lease (TTL 3 s) ends the lock; a
    // gRPC client under a lease nobody keeps alive then owns it until its
    // own lease expires.
    let third = lease(&cluster, &members[2], 2).await;
    let mut third_client = locks(&cluster, &members[2]).await;
    let waiting =
        tokio::spawn(async move { third_client.lock(LockRequest { name: b"job".to_vec(), lease: third }).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let out = stop_and_read(etcdctl_lock.take().unwrap());
    assert!(out.starts_with("job/"), "etcdctl printed the key it held: {out}");
    let got = tokio::time::timeout(Duration::from_secs(15), waiting).await.expect("lease expiry released").unwrap();
    assert_eq!(got.unwrap().into_inner().key, format!("job/{third:x}").into_bytes());
    must_see_keys(&cluster, &follower, "job/", |keys| keys.is_empty()).await;

    // A lease that does not exist is etcd's error.
    let err =
        locks(&cluster, &follower).await.lock(LockRequest { name: b"job".to_vec(), lease: 0x1234 }).await.unwrap_err();
    assert_eq!(err.message(), "etcdserver: requested lease not found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_lock_processes_exclude_each_other_until_the_holder_dies() {
    let cluster = Cluster::spawn(3).await;
    let endpoints = cluster.endpoints();
    let holder = cluster.etcdctl_child(&endpoints, &["lock", "--ttl=2", "mutex"]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let waiter = cluster.etcdctl_child(&endpoints, &["lock", "--ttl=2", "mutex"]);
    must_see_keys(&cluster, &endpoints, "mutex/", |keys| keys.len() == 2).await;
    // Killed, the holder's lease expires and the waiter owns the lock.
    assert!(stop_and_read(holder).starts_with("mutex/"));
    must_see_keys(&cluster, &endpoints, "mutex/", |keys| keys.len() == 1).await;
    let out = stop_and_read(waiter);
    assert!(out.starts_with("mutex/"), "the waiter got the lock: {out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_service_campaigns_proclaims_observes_and_resigns_across_a_leader_kill() {
    let mut cluster = Cluster::spawn(3).await;
    let leader = cluster.must_leader().await;
    let followers: Vec<String> =
        cluster.members.values().filter(|m| m.id != leader).map(|m| m.client.clone()).collect();
    let leader_addr = cluster.members[&leader].client.clone();
    let (f1, f2) = (followers[0].clone(), followers[1].clone());

    let err = elections(&cluster, &f1).await.leader(LeaderRequest { name: b"pick".to_vec() }).await.unwrap_err();
    assert_eq!(err.message(), "election: no leader");

    // Observers: a gRPC Observe stream on a follower, and `etcdctl elect -l`.
    let mut observe =
        elections(&cluster, &f1).await.observe(LeaderRequest { name: b"pick".to_vec() }).await.unwrap().into_inner();
    let listener = cluster.etcdctl_child(&format!("{f1},{f2}"), &["elect", "-l", "pick"]);
    tokio::time::sleep(Duration::from_millis(500)).await;

    let a = lease(&cluster, &f1, 6).await;
    let won = elections(&cluster, &leader_addr)
        .await
        .campaign(CampaignRequest { name: b"pick".to_vec(), lease: a, value: b"alpha".to_vec() })
        .await
        .unwrap()
        .into_inner();
    let a_key: LeaderKey = won.leader.unwrap();
    assert_eq!(a_key.key, format!("pick/{a:x}").into_bytes());
    let seen = observe.message().await.unwrap().unwrap();
    assert_eq!(seen.kv.unwrap().value, b"alpha");

    // A second campaigner waits behind the leader.
    let b = lease(&cluster, &f2, 60).await;
    let mut b_client = elections(&cluster, &f2).await;
    let b_campaign = tokio::spawn(async move {
        b_client.campaign(CampaignRequest { name: b"pick".to_vec(), lease: b, value: b"beta".to_vec() }).await
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!b_campaign.is_finished(), "a second leader was elected");

    elections(&cluster, &f2)
        .await
        .proclaim(ProclaimRequest { leader: Some(a_key.clone()), value: b"alpha-2".to_vec() })
        .await
        .unwrap();
    assert_eq!(observe.message().await.unwrap().unwrap().kv.unwrap().value, b"alpha-2");

    // Kill Skiff's leader (where the winner campaigned): the election's
    // leader, kept alive through a follower, stays.
    cluster.kill(leader);
    cluster.must_leader().await;
    keep_alive_once(&cluster, &f1, a).await;
    let current =
        elections(&cluster, &f2).await.leader(LeaderRequest { name: b"pick".to_vec() }).await.unwrap().into_inner();
    assert_eq!(current.kv.unwrap().value, b"alpha-2");

    // Resigning hands the election to the waiting campaigner; every
    // observer sees it.
    elections(&cluster, &f2).await.resign(ResignRequest { leader: Some(a_key.clone()) }).await.unwrap();
    let b_won = tokio::time::timeout(Duration::from_secs(10), b_campaign).await.expect("b elected").unwrap().unwrap();
    let b_key = b_won.into_inner().leader.unwrap();
    assert_eq!(b_key.key, format!("pick/{b:x}").into_bytes());
    assert_eq!(observe.message().await.unwrap().unwrap().kv.unwrap().value, b"beta");
    let err = elections(&cluster, &f1)
        .await
        .proclaim(ProclaimRequest { leader: Some(a_key), value: b"stale".to_vec() })
        .await
        .unwrap_err();
    assert_eq!(err.message(), "election: not leader");

    // Revoking b's lease leaves the election without a leader.
    revoke(&cluster, &f1, b).await;
    let err = elections(&cluster, &f1).await.leader(LeaderRequest { name: b"pick".to_vec() }).await.unwrap_err();
    assert_eq!(err.message(), "election: no leader");
    // An etcdctl campaigner takes it; the Observe stream follows.
    let campaigner = cluster.etcdctl_child(&f2, &["elect", "pick", "gamma"]);
    let seen = tokio::time::timeout(Duration::from_secs(10), observe.message()).await.expect("observed").unwrap();
    assert_eq!(seen.unwrap().kv.unwrap().value, b"gamma");
    stop_and_read(campaigner);

    tokio::time::sleep(Duration::from_secs(1)).await;
    let seen_by_etcdctl = stop_and_read(listener);
    for value in ["alpha\n", "alpha-2\n", "beta\n", "gamma\n"] {
        assert!(seen_by_etcdctl.contains(value), "etcdctl elect -l missed {value:?}: {seen_by_etcdctl}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn move_leader_hands_leadership_to_each_other_member() {
    let cluster = Cluster::spawn(3).await;
    let endpoints = cluster.endpoints();
    let ids: Vec<u64> = cluster.members.keys().copied().collect();
    for round in 0..2 {
        for &target in &ids {
            let leader = cluster.must_leader().await;
            if target == leader {
                continue;
            }
            // Writes keep flowing during the transfer.
            must_succeed(cluster.etcdctl(&endpoints, &["put", "/moved", &format!("{round}-{target}")]));
            let out = must_succeed(cluster.etcdctl(&endpoints, &["move-leader", &format!("{target:x}")]));
            assert!(out.contains(&format!("Leadership transferred from {leader:x} to {target:x}")), "{out}");
            assert_eq!(cluster.must_leader().await, target);
            let out = must_succeed(cluster.etcdctl(&endpoints, &["get", "/moved", "--print-value-only"]));
            assert_eq!(out.trim(), format!("{round}-{target}"));
        }
    }
    // etcd's errors: a non-member target, and a follower asked directly.
    let out = cluster.etcdctl(&endpoints, &["move-leader", "ff"]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(err.contains("etcdserver: bad leader transferee"), "{err}");
    let leader = cluster.must_leader().await;
    let follower = cluster.members.values().find(|m| m.id != leader).unwrap();
    let mut maintenance = skiff_proto::etcdserverpb::maintenance_client::MaintenanceClient::new(
        cluster.channel(&follower.client).await.unwrap(),
    );
    let err =
        maintenance.move_leader(skiff_proto::etcdserverpb::MoveLeaderRequest { target_id: leader }).await.unwrap_err();
    assert_eq!((err.code(), err.message()), (tonic::Code::FailedPrecondition, "etcdserver: not leader"));
}
