//! The chaos suite: real `skiff` processes, each in its own network
//! namespace, under a workload of reads, writes and compare-and-swaps on a
//! few keys plus resuming watchers (etcd API) and object writes with a
//! resuming resource watch (Kubernetes API), while a nemesis kills, pauses,
//! isolates and partitions members. Every operation is recorded with its
//! invocation and completion time; afterwards the checkers
//! (`skiff-checker`) search the history for a linearizability violation,
//! check the watch guarantees, and check that no acknowledged object write
//! was lost. A report (human summary + JSON) is written per run.
//!
//! The members run as `skiff up` runs them: TLS on every listener, mutual
//! TLS between the Raft peers, and every client of the workload presenting
//! the administrator's certificate.
//!
//! `make test` runs a short run; `make chaos` a long one. Knobs:
//! `SKIFF_CHAOS_DURATION` (seconds of faults), `SKIFF_CHAOS_SEED` (replays
//! a fault schedule), `SKIFF_CHAOS_MASTERS` (3 or 5), `SKIFF_CHAOS_REPORT`
//! (where the JSON report goes).

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use skiff_checker::{
    check_kv, check_resource_watch, check_watches, store_writes, Budget, Fault, KeyRange, ObjectWrite, Op, OpKind,
    Outcome, Report, ResourceEvent, ResourceEventType, WatchEntry, WatchEvent as CheckedWatchEvent, WatchLog,
};
use skiff_proto::etcdserverpb::kv_client::KvClient;
use skiff_proto::etcdserverpb::maintenance_client::MaintenanceClient;
use skiff_proto::etcdserverpb::watch_client::WatchClient;
use skiff_proto::etcdserverpb::{
    compare, request_op, watch_request, Compare, HashKvRequest, MoveLeaderRequest, PutRequest, RangeRequest, RequestOp,
    TxnRequest, WatchCreateRequest, WatchRequest,
};
use support::netns::Network;
use support::*;
use tonic::transport::Channel;

const KEYS: usize = 5;

fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// The members as the workload reaches them: their client ports, over TLS
/// as the cluster's administrator.
#[derive(Clone)]
struct Members {
    endpoints: Vec<String>,
    tls: Option<skiff_pki::Connector>,
}

impl Members {
    fn of(cluster: &Cluster, excluded: &[u64]) -> Members {
        let endpoints = cluster.running().filter(|m| !excluded.contains(&m.id)).map(|m| m.client.clone()).collect();
        Members { endpoints, tls: cluster.client_tls.clone() }
    }

    /// Lazily connected channels to every member (the test's side of the bridge).
    fn channels(&self) -> Vec<Channel> {
        self.endpoints
            .iter()
            .map(|e| {
                let endpoint = endpoint(e, self.tls.as_ref())
                    .connect_timeout(Duration::from_millis(300))
                    .timeout(Duration::from_secs(2));
                match &self.tls {
                    Some(tls) => endpoint.connect_with_connector_lazy(tls.clone()),
                    None => endpoint.connect_lazy(),
                }
            })
            .collect()
    }

    /// A resource API client of every member.
    fn client(&self) -> skiff_client::Client {
        skiff_client::Client::connect(&self.endpoints, None, self.tls.clone()).unwrap()
    }
}

/// One client of the KV workload: reads, writes and compare-and-swaps on
/// `KEYS` keys, each through a random member, every one recorded.
async fn kv_client(id: u64, members: Members, seed: u64, stop: Arc<AtomicBool>, history: Arc<Mutex<Vec<Op>>>) {
    let mut rng = StdRng::seed_from_u64(seed ^ (id * 7919));
    let chans = members.channels();
    let mut seq = 0u64;
    let mut last_seen: BTreeMap<String, Option<String>> = BTreeMap::new();
    while !stop.load(Ordering::Relaxed) {
        let key = format!("/chaos/k{}", rng.gen_range(0..KEYS));
        let mut kv = KvClient::new(chans[rng.gen_range(0..chans.len())].clone());
        seq += 1;
        let value = format!("c{id}-{seq}");
        let invoke_ns = now_ns();
        let roll = rng.gen_range(0..10);
        let op = if roll < 4 {
            match kv.range(RangeRequest { key: key.clone().into_bytes(), ..Default::default() }).await {
                Ok(r) => {
                    let r = r.into_inner();
                    let seen = r.kvs.first().map(|kv| String::from_utf8_lossy(&kv.value).into_owned());
                    let mod_revision = r.kvs.first().map_or(0, |kv| kv.mod_revision) as u64;
                    last_seen.insert(key.clone(), seen.clone());
                    Some(Op {
                        client: id,
                        key,
                        kind: OpKind::Read,
                        invoke_ns,
                        complete_ns: Some(now_ns()),
                        result: Outcome::Read {
                            value: seen,
                            revision: r.header.map_or(0, |h| h.revision) as u64,
                            mod_revision,
                        },
                    })
                }
                // A failed read says nothing about the store.
                Err(_) => None,
            }
        } else if roll < 7 {
            let put =
                PutRequest { key: key.clone().into_bytes(), value: value.clone().into_bytes(), ..Default::default() };
            let result = kv.put(put).await;
            Some(match result {
                Ok(r) => Op {
                    client: id,
                    key,
                    kind: OpKind::Write { value },
                    invoke_ns,
                    complete_ns: Some(now_ns()),
                    result: Outcome::Ok { revision: r.into_inner().header.map_or(0, |h| h.revision) as u64 },
                },
                Err(_) => Op {
                    client: id,
                    key,
                    kind: OpKind::Write { value },
                    invoke_ns,
                    complete_ns: None,
                    result: Outcome::Indeterminate,
                },
            })
        } else {
            let expected = last_seen.get(&key).cloned().flatten();
            let target = match &expected {
                Some(v) => compare::TargetUnion::Value(v.clone().into_bytes()),
                None => compare::TargetUnion::CreateRevision(0),
            };
            let target_kind =
                if expected.is_some() { compare::CompareTarget::Value } else { compare::CompareTarget::Create };
            let txn = TxnRequest {
                compare: vec![Compare {
                    result: compare::CompareResult::Equal as i32,
                    target: target_kind as i32,
                    key: key.clone().into_bytes(),
                    range_end: Vec::new(),
                    target_union: Some(target),
                }],
                success: vec![RequestOp {
                    request: Some(request_op::Request::RequestPut(PutRequest {
                        key: key.clone().into_bytes(),
                        value: value.clone().into_bytes(),
                        ..Default::default()
                    })),
                }],
                failure: vec![],
            };
            let kind = OpKind::Cas { expected, new: value };
            Some(match kv.txn(txn).await {
                Ok(r) => {
                    let r = r.into_inner();
                    let result = if r.succeeded {
                        Outcome::Ok { revision: r.header.map_or(0, |h| h.revision) as u64 }
                    } else {
                        Outcome::CasFailed
                    };
                    Op { client: id, key, kind, invoke_ns, complete_ns: Some(now_ns()), result }
                }
                Err(_) => Op { client: id, key, kind, invoke_ns, complete_ns: None, result: Outcome::Indeterminate },
            })
        };
        if let Some(op) = op {
            history.lock().unwrap().push(op);
        }
    }
}

/// A watcher of `/chaos/` that resumes on another member (from the revision
/// after the last one it saw) whenever its stream breaks.
async fn kv_watcher(id: u64, members: Members, seed: u64, stop: Arc<AtomicBool>) -> WatchLog {
    let mut rng = StdRng::seed_from_u64(seed ^ (id * 104_729));
    let chans = members.channels();
    let mut log = WatchLog {
        watcher: id,
        range: KeyRange::Prefix { prefix: "/chaos/".into() },
        start_revision: 0,
        entries: Vec::new(),
    };
    let mut next = 0i64;
    while !stop.load(Ordering::Relaxed) {
        let mut client = WatchClient::new(chans[rng.gen_range(0..chans.len())].clone());
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let create = WatchCreateRequest {
            key: b"/chaos/".to_vec(),
            range_end: b"/chaos0".to_vec(),
            start_revision: next,
            progress_notify: true,
            ..Default::default()
        };
        if tx
            .send(WatchRequest { request_union: Some(watch_request::RequestUnion::CreateRequest(create)) })
            .await
            .is_err()
        {
            continue;
        }
        let Ok(Ok(response)) =
            tokio::time::timeout(Duration::from_secs(2), client.watch(tokio_stream::wrappers::ReceiverStream::new(rx)))
                .await
        else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut stream = response.into_inner();
        if next > 0 {
            log.entries.push(WatchEntry::Resumed { start_revision: next as u64 });
        }
        loop {
            let msg = tokio::select! {
                m = stream.next() => m,
                _ = tokio::time::sleep(Duration::from_millis(300)) => {
                    if stop.load(Ordering::Relaxed) { return log; }
                    continue;
                }
            };
            let Some(Ok(resp)) = msg else { break };
            if resp.canceled {
                panic!("watcher {id} canceled: {}", resp.cancel_reason);
            }
            if resp.created && next == 0 {
                // From now: the first event the watcher may see is the next revision.
                next = resp.header.as_ref().map_or(0, |h| h.revision) + 1;
                log.start_revision = next as u64;
                continue;
            }
            let revision = resp.header.as_ref().map_or(0, |h| h.revision);
            if resp.events.is_empty() {
                if !resp.created && revision > 0 {
                    log.entries.push(WatchEntry::Progress { revision: revision as u64 });
                }
                continue;
            }
            for e in &resp.events {
                let kv = e.kv.clone().unwrap_or_default();
                log.entries.push(WatchEntry::Event(CheckedWatchEvent {
                    key: String::from_utf8_lossy(&kv.key).into_owned(),
                    value: (e.r#type == 0).then(|| String::from_utf8_lossy(&kv.value).into_owned()),
                    revision: kv.mod_revision as u64,
                }));
                next = next.max(kv.mod_revision + 1);
            }
        }
        drop(tx);
    }
    log
}

/// Object writes through the resource API, and one resuming resource watch.
async fn object_workload(members: Members, stop: Arc<AtomicBool>) -> (Vec<ObjectWrite>, Vec<ResourceEvent>) {
    use skiff_api::resources::of;
    use skiff_api::Kind;
    use skiff_client::resources::{EventType, WatchParams};
    let client = members.client();
    let cms = of(Kind::ConfigMap);
    let writes = Arc::new(Mutex::new(Vec::new()));
    let writer = {
        let (client, stop, writes) = (client.clone(), stop.clone(), writes.clone());
        tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let name = format!("cm-{}", i % 10);
                let body = json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": name, "namespace": "default"}, "data": {"i": i.to_string()}});
                let result = match client.get(cms, "default", &name).await {
                    Ok(mut live) => {
                        live["data"] = body["data"].clone();
                        client.update(cms, &live).await
                    }
                    Err(_) => client.create(cms, "default", &body).await,
                };
                if let Ok(obj) = result {
                    let rv: u64 = skiff_api::meta::resource_version(&obj).and_then(|r| r.parse().ok()).unwrap_or(0);
                    writes.lock().unwrap().push(ObjectWrite { name, resource_version: rv, deleted: false });
                } else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        })
    };
    let mut events = Vec::new();
    let mut params = WatchParams { resource_version: "0".into(), allow_bookmarks: true, ..Default::default() };
    while !stop.load(Ordering::Relaxed) {
        let Ok(stream) = client.watch(cms, "default", &params).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut stream = Box::pin(stream);
        loop {
            let next = tokio::select! {
                e = stream.next() => e,
                _ = tokio::time::sleep(Duration::from_millis(300)) => {
                    if stop.load(Ordering::Relaxed) { break; }
                    continue;
                }
            };
            let Some(Ok(e)) = next else { break };
            let rv: u64 = e.resource_version().and_then(|r| r.parse().ok()).unwrap_or(0);
            if e.kind == EventType::Error {
                break;
            }
            params.resource_version = rv.to_string();
            let name = skiff_api::meta::name(&e.object).unwrap_or_default().to_string();
            let event_type = match e.kind {
                EventType::Added => ResourceEventType::Added,
                EventType::Modified => ResourceEventType::Modified,
                EventType::Deleted => ResourceEventType::Deleted,
                EventType::Bookmark | EventType::Error => ResourceEventType::Bookmark,
            };
            events.push(ResourceEvent { event_type, name, resource_version: rv });
        }
    }
    writer.await.unwrap();
    let writes = writes.lock().unwrap().clone();
    (writes, events)
}

/// The leader a majority of reachable members agree on, if it answers itself.
async fn find_leader(cluster: &Cluster, excluded: &[u64]) -> Option<u64> {
    let mut votes: BTreeMap<u64, usize> = BTreeMap::new();
    let mut answered = Vec::new();
    for m in cluster.running().filter(|m| !excluded.contains(&m.id)) {
        if let Ok(Ok(s)) = tokio::time::timeout(Duration::from_millis(500), cluster.status(&m.client)).await {
            answered.push(m.id);
            if s.leader != 0 {
                *votes.entry(s.leader).or_default() += 1;
            }
        }
    }
    let majority = cluster.members.len() / 2 + 1;
    votes.into_iter().find(|(l, n)| *n >= majority.min(answered.len()) && answered.contains(l)).map(|(l, _)| l)
}

async fn must_find_leader(cluster: &Cluster, excluded: &[u64]) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(l) = find_leader(cluster, excluded).await {
            return l;
        }
        assert!(Instant::now() < deadline, "no leader among the reachable members for 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// From a fault to the first write that succeeds through any member not in `excluded`.
async fn time_to_write(cluster: &Cluster, excluded: &[u64], since: Instant) -> Duration {
    let chans = Members::of(cluster, excluded).channels();
    let deadline = since + Duration::from_secs(30);
    let mut i = 0;
    loop {
        let mut kv = KvClient::new(chans[i % chans.len()].clone());
        i += 1;
        let mut req =
            tonic::Request::new(PutRequest { key: b"/probe".to_vec(), value: b"p".to_vec(), ..Default::default() });
        req.set_timeout(Duration::from_secs(1));
        if kv.put(req).await.is_ok() {
            return since.elapsed();
        }
        assert!(Instant::now() < deadline, "no write succeeded within 30 s of the fault");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Joins member `id` (a new namespace, `--join` through `via`), waits for
/// it to be promoted to voter, then removes it again, all under load.
async fn add_then_remove(cluster: &mut Cluster, net: &mut Network, id: u64, via: u64) {
    let addr = net.add(id).expect("a namespace for the joining member");
    let ns = net.namespace(id).to_string();
    cluster.add_member_in(id, &ns, &addr);
    let join = cluster.members[&via].client.clone();
    cluster.start_with(id, &["--join", &join, "--join-timeout", "30s"]);
    let deadline = Instant::now() + Duration::from_secs(40);
    let hex = format!("{id:x}");
    loop {
        let out = stdout(&cluster.etcdctl(&join, &["member", "list", "-w", "simple"]));
        if out.lines().any(|l| l.starts_with(&format!("{hex}, started")) && l.trim_end().ends_with("false")) {
            break;
        }
        assert!(Instant::now() < deadline, "member {id} was not promoted: {out}\n{}", cluster.log_of(id));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let leader = must_find_leader(cluster, &[]).await;
    let via = cluster.members[&leader].client.clone();
    must_succeed(cluster.etcdctl(&via, &["member", "remove", &hex]));
    cluster.kill(id);
    cluster.members.remove(&id);
}

/// etcd's MoveLeader from `leader` to `target`, with etcdctl's deadline.
async fn move_leader(cluster: &Cluster, leader: u64, target: u64) -> Result<(), tonic::Status> {
    let channel = cluster.channel(&cluster.members[&leader].client).await.map_err(tonic::Status::unavailable)?;
    let mut request = tonic::Request::new(MoveLeaderRequest { target_id: target });
    request.set_timeout(Duration::from_secs(5));
    MaintenanceClient::new(channel).move_leader(request).await.map(|_| ())
}

#[derive(Clone, Copy, Debug)]
enum Nemesis {
    KillLeader,
    KillRandom,
    PauseLeader,
    IsolateLeader,
    SplitMinority,
    RollingRestart,
    AddRemoveMember,
    /// etcd's MoveLeader to another member, under the workload.
    MoveLeader,
}

/// The fault schedule: every kind early (so even a short run has at least
/// five leader kills and a partition), then a seeded random mix.
fn schedule(rng: &mut StdRng, n: usize, long: bool) -> Vec<Nemesis> {
    use Nemesis::*;
    let mut out = vec![
        KillLeader,
        IsolateLeader,
        KillLeader,
        PauseLeader,
        KillLeader,
        SplitMinority,
        KillLeader,
        AddRemoveMember,
        KillRandom,
        MoveLeader,
        KillLeader,
    ];
    let pool: &[Nemesis] = if long {
        &[
            KillLeader,
            KillRandom,
            PauseLeader,
            IsolateLeader,
            SplitMinority,
            KillLeader,
            RollingRestart,
            AddRemoveMember,
            MoveLeader,
        ]
    } else {
        &[KillLeader, KillRandom, PauseLeader, IsolateLeader, SplitMinority, MoveLeader]
    };
    while out.len() < n {
        out.push(pool[rng.gen_range(0..pool.len())]);
    }
    out.truncate(n.max(10));
    out
}

/// Once the faults are over, every member holds the same state: the leader's
/// revision is applied everywhere and etcd's HashKV at it is equal on all.
async fn members_hash_alike(cluster: &Cluster) {
    let leader = must_find_leader(cluster, &[]).await;
    let revision =
        cluster.status(&cluster.members[&leader].client).await.expect("leader status").header.unwrap().revision;
    let mut hashes = BTreeMap::new();
    for m in cluster.running() {
        cluster.must_catch_up(m.id, revision, Duration::from_secs(60)).await;
        let mut c = MaintenanceClient::new(cluster.channel(&m.client).await.expect("connect"));
        let reply = c.hash_kv(HashKvRequest { revision }).await.expect("hashkv").into_inner();
        assert_eq!(reply.hash_revision, revision);
        hashes.insert(m.id, reply.hash);
    }
    let first = *hashes.values().next().expect("a running member");
    assert!(hashes.values().all(|h| *h == first), "members diverged: HashKV at {revision} by member: {hashes:?}");
    println!("every member's HashKV at revision {revision} is {first:08x}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_loses_nothing_and_stays_linearizable() {
    let seconds = env_u64("SKIFF_CHAOS_DURATION", 60);
    let seed = env_u64("SKIFF_CHAOS_SEED", now_ns() % 1_000_000);
    let masters = env_u64("SKIFF_CHAOS_MASTERS", 3);
    let long = seconds > 120;
    println!("chaos: seed {seed}, {seconds} s, {masters} masters (replay with SKIFF_CHAOS_SEED={seed})");
    let mut rng = StdRng::seed_from_u64(seed);

    let ids: Vec<u64> = (1..=masters).collect();
    let mut net = Network::create(&ids).expect("network namespaces (run as root with iproute2)");
    let mut next_id = masters;
    let mut cluster = Cluster::spawn_in(&net, masters, &[]).await;
    let members = Members::of(&cluster, &[]);
    // The default namespace exists before object writes start.
    let client = members.client();
    let deadline = Instant::now() + Duration::from_secs(20);
    while client.get(skiff_api::resources::of(skiff_api::Kind::Namespace), "", "default").await.is_err() {
        assert!(Instant::now() < deadline, "namespace default never appeared");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let stop = Arc::new(AtomicBool::new(false));
    let history = Arc::new(Mutex::new(Vec::new()));
    let clients: Vec<_> =
        (0..6).map(|id| tokio::spawn(kv_client(id, members.clone(), seed, stop.clone(), history.clone()))).collect();
    let watchers: Vec<_> = (0..2).map(|id| tokio::spawn(kv_watcher(id, members.clone(), seed, stop.clone()))).collect();
    let objects = tokio::spawn(object_workload(members.clone(), stop.clone()));

    let started = Instant::now();
    let origin_ns = now_ns();
    // Long runs inject at least 100 faults, short ones at least 10.
    let min_faults = if long { 100 } else { 10 };
    // Enough for the whole duration: faults go on until it has passed.
    let faults_planned = (seconds as usize).max(min_faults);
    let mut faults = Vec::new();
    let mut failovers = Vec::new();
    let fault_counter = AtomicU64::new(0);
    for nemesis in schedule(&mut rng, faults_planned, long) {
        if started.elapsed() > Duration::from_secs(seconds)
            && fault_counter.load(Ordering::Relaxed) >= min_faults as u64
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(1000..2500))).await;
        let leader = must_find_leader(&cluster, &[]).await;
        let at = Instant::now();
        let at_ns = now_ns();
        let (kind, target, excluded): (&str, Vec<u64>, Vec<u64>) = match nemesis {
            Nemesis::KillLeader => {
                cluster.kill(leader);
                ("kill-leader", vec![leader], vec![leader])
            }
            Nemesis::KillRandom => {
                let victim = ids[rng.gen_range(0..ids.len())];
                cluster.kill(victim);
                ("kill-random", vec![victim], vec![victim])
            }
            Nemesis::PauseLeader => {
                cluster.signal(leader, "STOP");
                ("pause-leader", vec![leader], vec![leader])
            }
            Nemesis::IsolateLeader => {
                net.isolate(&[leader]).unwrap();
                ("isolate-leader", vec![leader], vec![leader])
            }
            Nemesis::SplitMinority => {
                // The leader and enough others to make the largest minority.
                let size = (masters as usize - 1) / 2;
                let mut minority = vec![leader];
                minority.extend(ids.iter().copied().filter(|i| *i != leader).take(size - 1));
                net.split(&minority).unwrap();
                ("split-majority-minority", minority.clone(), minority)
            }
            Nemesis::RollingRestart => {
                for id in ids.clone() {
                    cluster.stop(id);
                    cluster.start(id);
                    must_find_leader(&cluster, &[]).await;
                }
                ("rolling-restart", ids.clone(), vec![])
            }
            Nemesis::AddRemoveMember => {
                next_id += 1;
                let id = next_id;
                add_then_remove(&mut cluster, &mut net, id, leader).await;
                ("add-remove-member", vec![id], vec![])
            }
            Nemesis::MoveLeader => {
                let others: Vec<u64> = ids.iter().copied().filter(|i| *i != leader).collect();
                let target = others[rng.gen_range(0..others.len())];
                let moved = move_leader(&cluster, leader, target).await;
                println!("move-leader {leader} -> {target}: {moved:?}");
                // A transfer that timed out may leave the old leader.
                let excluded = if moved.is_ok() { vec![leader] } else { vec![] };
                ("move-leader", vec![target], excluded)
            }
        };
        fault_counter.fetch_add(1, Ordering::Relaxed);
        let new_leader = must_find_leader(&cluster, &excluded).await;
        let without_leader = at.elapsed();
        let failover = time_to_write(&cluster, &excluded, at).await;
        assert!(!excluded.contains(&new_leader));
        // Keep the fault a while under load, then heal.
        tokio::time::sleep(Duration::from_millis(rng.gen_range(500..1500))).await;
        match nemesis {
            Nemesis::KillLeader | Nemesis::KillRandom => cluster.start(target[0]),
            Nemesis::PauseLeader => cluster.signal(target[0], "CONT"),
            Nemesis::IsolateLeader | Nemesis::SplitMinority => net.heal().unwrap(),
            Nemesis::RollingRestart | Nemesis::AddRemoveMember | Nemesis::MoveLeader => {}
        }
        let healed_ns = now_ns();
        println!(
            "fault {kind} on {target:?}: leader {new_leader} after {without_leader:?}, first write after {failover:?}"
        );
        let leader_lost = !matches!(
            nemesis,
            Nemesis::RollingRestart | Nemesis::KillRandom | Nemesis::AddRemoveMember | Nemesis::MoveLeader
        );
        faults.push(Fault {
            kind: kind.to_string(),
            target: target.iter().map(|t| format!("master-{t}")).collect::<Vec<_>>().join(","),
            at_ns: at_ns - origin_ns,
            healed_at_ns: Some(healed_ns - origin_ns),
            leaderless_ms: leader_lost.then_some(without_leader.as_millis() as u64),
        });
        if leader_lost {
            failovers.push(failover);
        }
    }
    // Let everyone catch up, then stop the workload.
    must_find_leader(&cluster, &[]).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    let mut logs = Vec::new();
    for w in watchers {
        logs.push(w.await.unwrap());
    }
    let (object_writes, object_events) = objects.await.unwrap();
    let history = history.lock().unwrap().clone();
    members_hash_alike(&cluster).await;

    // A 10-minute run now records ~8,000 operations per key, many of them
    // indeterminate; the default 2,000,000 search steps left one key
    // undecided in two runs. The wall-clock limit still bounds the check.
    let budget = Budget { max_steps: 20_000_000, ..Budget::default() };
    let kv = check_kv(&history, &budget).expect("the recorded history is well formed");
    let mut report = Report::new(seed, &history, faults);
    report.add_kv(&kv);
    report.add_violations(check_watches(&store_writes(&history), &logs).expect("the watch logs are well formed"));
    report.add_violations(check_resource_watch(&object_writes, &object_events));
    let summary = report.summary();
    println!("{summary}");
    failovers.sort();
    if let (Some(p50), Some(max)) = (failovers.get(failovers.len() / 2), failovers.last()) {
        println!("first successful write after a leader fault: p50 {p50:?}, max {max:?} ({} faults)", failovers.len());
    }
    let path = std::env::var("SKIFF_CHAOS_REPORT")
        .unwrap_or_else(|_| format!("{}/chaos-report-{seed}.json", env!("CARGO_TARGET_TMPDIR")));
    std::fs::write(&path, report.to_json().unwrap()).unwrap();
    println!("report: {path}");
    assert!(report.passed(), "chaos found violations (seed {seed}):\n{summary}");
    assert!(report.faults.len() >= min_faults, "at least {min_faults} faults were injected");
    assert!(history.len() > 200, "enough operations to mean something: {}", history.len());
}
