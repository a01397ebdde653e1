//! The real `etcdctl` (3.4, Debian's etcd-client) against a real Skiff
//! cluster, one test per group of commands, against a follower and the
//! leader alike.

mod support;

use std::time::Duration;

use support::*;

async fn cluster_and_follower() -> (Cluster, String, String) {
    let cluster = Cluster::spawn(3).await;
    let leader = cluster.must_leader().await;
    let follower = cluster.members.keys().copied().find(|id| *id != leader).unwrap();
    let f = cluster.members[&follower].client.clone();
    let l = cluster.members[&leader].client.clone();
    (cluster, f, l)
}

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_get_and_delete_work_through_any_member() {
    let (cluster, follower, leader) = cluster_and_follower().await;
    for (ep, p) in [(&follower, "f"), (&leader, "l")] {
        assert_eq!(must_succeed(cluster.etcdctl(ep, &["put", &format!("/{p}/a"), "1"])).trim(), "OK");
        must_succeed(cluster.etcdctl(ep, &["put", &format!("/{p}/b"), "2"]));
        must_succeed(cluster.etcdctl(ep, &["put", &format!("/{p}/c"), "3"]));
        let out = must_succeed(cluster.etcdctl(ep, &["get", &format!("/{p}/a")]));
        assert_eq!(out, format!("/{p}/a\n1\n"));
        let out = must_succeed(cluster.etcdctl(ep, &["get", "--prefix", &format!("/{p}/")]));
        assert_eq!(out, format!("/{p}/a\n1\n/{p}/b\n2\n/{p}/c\n3\n"));
        let out = must_succeed(cluster.etcdctl(ep, &["get", "--prefix", "--limit=2", &format!("/{p}/")]));
        assert_eq!(out, format!("/{p}/a\n1\n/{p}/b\n2\n"));
        let out = must_succeed(cluster.etcdctl(ep, &["get", "--prefix", "--keys-only", &format!("/{p}/")]));
        assert_eq!(
            out.split_whitespace().collect::<Vec<_>>(),
            [format!("/{p}/a"), format!("/{p}/b"), format!("/{p}/c")]
        );
        // etcdctl 3.4 has no --count-only; its JSON output carries the count.
        let out = must_succeed(cluster.etcdctl(ep, &["get", "--prefix", "--limit=1", "-w", "json", &format!("/{p}/")]));
        assert_eq!(json(&out)["count"], 3);
        assert_eq!(json(&out)["more"], true);
        let out = must_succeed(cluster.etcdctl(ep, &["get", "--consistency=s", &format!("/{p}/b")]));
        assert!(out.contains(&format!("/{p}/b\n2")), "{out}");
        let out = must_succeed(cluster.etcdctl(ep, &["del", "--prev-kv", &format!("/{p}/a")]));
        assert_eq!(out, format!("1\n/{p}/a\n1\n"));
        let out = must_succeed(cluster.etcdctl(ep, &["del", "--prefix", &format!("/{p}/")]));
        assert_eq!(out.trim(), "2");
        let out = must_succeed(cluster.etcdctl(ep, &["get", "--prefix", &format!("/{p}/")]));
        assert_eq!(out, "");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_at_past_revisions_and_compaction_behave_like_etcd() {
    let (cluster, follower, _) = cluster_and_follower().await;
    let rev_of = |out: &str| json(out)["header"]["revision"].as_i64().unwrap();
    let r1 = rev_of(&must_succeed(cluster.etcdctl(&follower, &["put", "k", "one", "-w", "json"])));
    let r2 = rev_of(&must_succeed(cluster.etcdctl(&follower, &["put", "k", "two", "-w", "json"])));
    must_succeed(cluster.etcdctl(&follower, &["put", "k", "three"]));
    let out = must_succeed(cluster.etcdctl(&follower, &["get", "k", &format!("--rev={r1}")]));
    assert_eq!(out, "k\none\n");
    let out = must_succeed(cluster.etcdctl(&follower, &["get", "k", &format!("--rev={r2}")]));
    assert_eq!(out, "k\ntwo\n");
    let out = must_succeed(cluster.etcdctl(&follower, &["compaction", &r2.to_string()]));
    assert_eq!(out.trim(), format!("compacted revision {r2}"));
    let out = cluster.etcdctl(&follower, &["get", "k", &format!("--rev={r1}")]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("required revision has been compacted"));
    let out = must_succeed(cluster.etcdctl(&follower, &["get", "k", &format!("--rev={r2}")]));
    assert_eq!(out, "k\ntwo\n");
    let out = cluster.etcdctl(&follower, &["get", "k", "--rev=100000"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("required revision is a future revision"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_compares_value_version_and_revisions() {
    let (cluster, follower, _) = cluster_and_follower().await;
    must_succeed(cluster.etcdctl(&follower, &["put", "t", "v1"]));
    let txn =
        |input: &str| must_succeed(cluster.etcdctl_stdin(&follower, &["txn", "--interactive=false"], Some(input)));
    let out = txn("value(\"t\") = \"v1\"\n\nput t v2\n\nput t nope\n\n");
    assert_eq!(out, "SUCCESS\n\nOK\n");
    let out = txn("version(\"t\") = \"1\"\n\nput t nope\n\nget t\n\n");
    assert_eq!(out, "FAILURE\n\nt\nv2\n");
    let kv = json(&must_succeed(cluster.etcdctl(&follower, &["get", "t", "-w", "json"])))["kvs"][0].clone();
    let (create, modr) = (kv["create_revision"].as_i64().unwrap(), kv["mod_revision"].as_i64().unwrap());
    let out = txn(&format!("create(\"t\") = \"{create}\"\nmod(\"t\") = \"{modr}\"\n\nput t v3\n\n\n"));
    assert_eq!(out, "SUCCESS\n\nOK\n");
    let out = txn(&format!("mod(\"t\") < \"{modr}\"\n\n\nget t\n\n"));
    assert_eq!(out, "FAILURE\n\nt\nv3\n");
}

fn stop_and_read(mut child: std::process::Child) -> String {
    let _ = child.kill();
    stdout(&child.wait_with_output().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_replays_history_with_prev_kv_and_follows_live() {
    let (cluster, follower, leader) = cluster_and_follower().await;
    must_succeed(cluster.etcdctl(&leader, &["put", "/w/a", "1"]));
    must_succeed(cluster.etcdctl(&leader, &["put", "/w/a", "2"]));
    must_succeed(cluster.etcdctl(&leader, &["del", "/w/a"]));
    // Replay from revision 1 on a follower, with previous values.
    let replay = cluster.etcdctl_child(&follower, &["watch", "--prefix", "/w/", "--rev=1", "--prev-kv"]);
    let live = cluster.etcdctl_child(&follower, &["watch", "/w/b"]);
    tokio::time::sleep(Duration::from_secs(1)).await;
    must_succeed(cluster.etcdctl(&leader, &["put", "/w/b", "live"]));
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let out = stop_and_read(replay);
    assert_eq!(out, "PUT\n/w/a\n1\nPUT\n/w/a\n1\n/w/a\n2\nDELETE\n/w/a\n2\n/w/a\n\nPUT\n/w/b\nlive\n", "{out}");
    let out = stop_and_read(live);
    assert_eq!(out, "PUT\n/w/b\nlive\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_from_a_compacted_revision_is_refused() {
    let (cluster, follower, _) = cluster_and_follower().await;
    for v in ["1", "2", "3"] {
        must_succeed(cluster.etcdctl(&follower, &["put", "c", v]));
    }
    let rev = json(&must_succeed(cluster.etcdctl(&follower, &["get", "c", "-w", "json"])))["header"]["revision"]
        .as_i64()
        .unwrap();
    must_succeed(cluster.etcdctl(&follower, &["compaction", &rev.to_string()]));
    let w = cluster.etcdctl_child(&follower, &["watch", "c", "--rev=1"]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut w = w;
    let _ = w.kill();
    let out = w.wait_with_output().unwrap();
    let all = format!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
    assert!(all.contains("compacted"), "{all}");
}

/// `etcdctl endpoint hashkv --rev R` from every member (etcdctl 3.4 shows
/// the hash, not the revision hashed).
fn hashes_at(cluster: &Cluster, revision: i64) -> Vec<u64> {
    let out = must_succeed(
        cluster.etcdctl(&cluster.endpoints(), &["endpoint", "hashkv", &format!("--rev={revision}"), "-w", "json"]),
    );
    let all = json(&out);
    let all = all.as_array().unwrap_or_else(|| panic!("one answer per endpoint: {out}"));
    assert_eq!(all.len(), 3, "{out}");
    all.iter().map(|e| e["HashKV"]["hash"].as_u64().unwrap_or_else(|| panic!("no hash: {out}"))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hashkv_agrees_across_members_and_pins_a_revision() {
    let (cluster, follower, _) = cluster_and_follower().await;
    let rev_of = |out: &str| json(out)["header"]["revision"].as_i64().unwrap();
    must_succeed(cluster.etcdctl(&follower, &["put", "a", "1"]));
    must_succeed(cluster.etcdctl(&follower, &["put", "b", "2"]));
    must_succeed(cluster.etcdctl(&follower, &["put", "a", "3"]));
    must_succeed(cluster.etcdctl(&follower, &["del", "b"]));
    let r = rev_of(&must_succeed(cluster.etcdctl(&follower, &["put", "c", "4", "-w", "json"])));
    for id in cluster.members.keys() {
        cluster.must_catch_up(*id, r, Duration::from_secs(10)).await;
    }
    let at_r = hashes_at(&cluster, r);
    assert!(at_r.iter().all(|h| *h == at_r[0]), "members disagree at {r}: {at_r:?}");
    let earlier = hashes_at(&cluster, r - 1);
    assert!(earlier.iter().all(|h| *h == earlier[0]), "{earlier:?}");
    assert_ne!(earlier[0], at_r[0], "a revision's change is in its hash");

    // Later writes do not move the hash of a past revision.
    let r2 = rev_of(&must_succeed(cluster.etcdctl(&follower, &["put", "d", "5", "-w", "json"])));
    for id in cluster.members.keys() {
        cluster.must_catch_up(*id, r2, Duration::from_secs(10)).await;
    }
    assert_eq!(hashes_at(&cluster, r), at_r);

    // etcd's Hash (whole keyspace) agrees too once every member applied the same log.
    let mut whole = Vec::new();
    for m in cluster.members.values() {
        let mut c = skiff_proto::etcdserverpb::maintenance_client::MaintenanceClient::new(
            cluster.channel(&m.client).await.expect("connect"),
        );
        whole.push(c.hash(skiff_proto::etcdserverpb::HashRequest {}).await.expect("hash").into_inner().hash);
    }
    assert!(whole.iter().all(|h| *h == whole[0]), "{whole:?}");

    // Compaction: still equal across members; compacted and future revisions are refused.
    must_succeed(cluster.etcdctl(&follower, &["compaction", &(r - 1).to_string()]));
    for id in cluster.members.keys() {
        cluster.must_catch_up(*id, r2, Duration::from_secs(10)).await;
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let out = cluster.etcdctl(&cluster.endpoints(), &["endpoint", "hashkv", "--rev=1"]);
        let refused = String::from_utf8_lossy(&out.stderr)
            .lines()
            .filter(|l| l.starts_with("Failed to get the hash") && l.contains("required revision has been compacted"))
            .count();
        if refused == 3 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{}", String::from_utf8_lossy(&out.stderr));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = hashes_at(&cluster, r);
    assert!(after.iter().all(|h| *h == after[0]), "{after:?}");
    let out = cluster.etcdctl(&follower, &["endpoint", "hashkv", "--rev=100000"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("required revision is a future revision"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_endpoints_and_learners_through_etcdctl() {
    let (mut cluster, follower, leader) = cluster_and_follower().await;
    let out = must_succeed(cluster.etcdctl(&follower, &["member", "list"]));
    assert_eq!(out.lines().count(), 3, "{out}");
    let out = cluster.etcdctl(&cluster.endpoints(), &["endpoint", "health"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(err.matches("is healthy").count(), 3, "{err}");
    let out = must_succeed(cluster.etcdctl(&cluster.endpoints(), &["endpoint", "status"]));
    assert_eq!(out.lines().count(), 3, "{out}");
    assert_eq!(out.matches(", true, false,").count(), 1, "exactly one leader: {out}");

    // Add a learner, start it, promote it, then remove it.
    cluster.add_member(4);
    let peer = cluster.members[&4].peer.clone();
    let out = must_succeed(
        cluster.etcdctl(&follower, &["member", "add", "m4", &format!("--peer-urls=http://{peer}"), "--learner"]),
    );
    assert!(out.contains("added to cluster"), "{out}");
    let id_hex = out.split_whitespace().nth(1).unwrap().to_string();
    let id = u64::from_str_radix(&id_hex, 16).unwrap();
    assert_eq!(id, 4, "{out}");
    cluster.start_with(4, &["--join", &leader]);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let out = cluster.etcdctl(&leader, &["member", "promote", &id_hex]);
        if out.status.success() {
            assert!(stdout(&out).contains("promoted"), "{}", stdout(&out));
            break;
        }
        assert!(std::time::Instant::now() < deadline, "promote failed: {}", String::from_utf8_lossy(&out.stderr));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let out = must_succeed(cluster.etcdctl(&leader, &["member", "list"]));
    assert_eq!(out.lines().count(), 4, "{out}");
    assert!(!out.lines().any(|l| l.ends_with("true")), "no learner left: {out}");
    must_succeed(cluster.etcdctl(&leader, &["member", "remove", &id_hex]));
    let out = cluster.etcdctl(&leader, &["member", "remove", "ff"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("member not found"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_update_moves_a_member_to_a_new_peer_address() {
    let (mut cluster, _, leader) = cluster_and_follower().await;
    let leader_id = cluster.must_leader().await;
    let mut followers = cluster.members.keys().copied().filter(|id| *id != leader_id);
    let (moved, other) = (followers.next().unwrap(), followers.next().unwrap());
    let new_peer = format!("127.0.0.1:{}", free_port());

    let taken = cluster.members[&other].peer.clone();
    let out =
        cluster.etcdctl(&leader, &["member", "update", &format!("{moved:x}"), &format!("--peer-urls=http://{taken}")]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("Peer URLs already exists"), "{out:?}");
    let out = cluster.etcdctl(&leader, &["member", "update", "ff", &format!("--peer-urls=http://{new_peer}")]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("member not found"), "{out:?}");

    let out = must_succeed(
        cluster
            .etcdctl(&leader, &["member", "update", &format!("{moved:x}"), &format!("--peer-urls=http://{new_peer}")]),
    );
    assert!(out.contains("updated"), "{out}");
    let out = must_succeed(cluster.etcdctl(&leader, &["member", "list"]));
    assert!(out.contains(&format!("http://{new_peer}")), "{out}");

    // The member restarts listening at its new address and keeps its data.
    cluster.stop(moved);
    cluster.members.get_mut(&moved).unwrap().peer = new_peer;
    cluster.start(moved);
    // With the third member down, every write needs the moved one's vote.
    cluster.stop(other);
    let out = must_succeed(cluster.etcdctl(&leader, &["put", "moved", "yes", "-w", "json"]));
    let revision = json(&out)["header"]["revision"].as_i64().unwrap();
    cluster.must_catch_up(moved, revision, Duration::from_secs(20)).await;
    let out = must_succeed(cluster.etcdctl(&cluster.members[&moved].client, &["get", "moved", "--consistency=s"]));
    assert_eq!(out, "moved\nyes\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_etcds_errors() {
    let (cluster, follower, _) = cluster_and_follower().await;
    let out = cluster.etcdctl(&follower, &["put", "", "v"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("key is not provided"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let big = "x".repeat(1_600_000);
    let out = cluster.etcdctl_stdin(&follower, &["put", "big"], Some(&big));
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("request is too large"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Nothing was written by the refused requests.
    let out = must_succeed(cluster.etcdctl(&follower, &["get", "big"]));
    assert_eq!(out, "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_expire_attached_keys_on_every_member_also_across_a_leader_change() {
    let (mut cluster, follower, leader) = cluster_and_follower().await;
    let out = must_succeed(cluster.etcdctl(&follower, &["lease", "grant", "4"]));
    assert!(out.contains("granted with TTL(4s)"), "{out}");
    let id = out.split_whitespace().nth(1).unwrap().to_string();
    must_succeed(cluster.etcdctl(&follower, &["put", "--lease", &id, "/leased/a", "1"]));
    must_succeed(cluster.etcdctl(&follower, &["put", "--lease", &id, "/leased/b", "2"]));
    let out = cluster.etcdctl(&follower, &["put", "--lease", "123abc", "/leased/c", "3"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("requested lease not found"));
    let out = must_succeed(cluster.etcdctl(&follower, &["lease", "list"]));
    assert!(out.contains(&id), "{out}");
    let out = must_succeed(cluster.etcdctl(&follower, &["lease", "timetolive", &id, "--keys"]));
    assert!(out.contains("attached keys([/leased/a /leased/b])"), "{out}");
    // Keep-alives through a follower hold the lease past its TTL.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let out = must_succeed(cluster.etcdctl(&follower, &["lease", "keep-alive", "--once", &id]));
        assert!(out.contains("keepalived with TTL(4)"), "{out}");
    }
    let out = must_succeed(cluster.etcdctl(&follower, &["get", "--prefix", "/leased/", "--keys-only"]));
    assert_eq!(out.split_whitespace().count(), 2, "{out}");
    // Kill the leader: the new one restarts the lease clock, then expires it.
    let old_leader = cluster.members.values().find(|m| m.client == leader).unwrap().id;
    cluster.kill(old_leader);
    cluster.must_leader().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let gone = cluster.running().all(|m| {
            let out = must_succeed(cluster.etcdctl(&m.client, &["get", "--prefix", "/leased/", "--consistency=s"]));
            out.is_empty()
        });
        if gone {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "leased keys outlived their lease");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let out = must_succeed(cluster.etcdctl(&follower, &["lease", "timetolive", &id]));
    assert!(out.contains("already expired"), "{out}");
    let out = must_succeed(cluster.etcdctl(&follower, &["lease", "list"]));
    assert!(!out.contains(&id), "{out}");
    // A revoke deletes attached keys at once.
    let out = must_succeed(cluster.etcdctl(&follower, &["lease", "grant", "100"]));
    let id = out.split_whitespace().nth(1).unwrap().to_string();
    must_succeed(cluster.etcdctl(&follower, &["put", "--lease", &id, "/revoked", "x"]));
    let out = must_succeed(cluster.etcdctl(&follower, &["lease", "revoke", &id]));
    assert!(out.contains("revoked"), "{out}");
    assert_eq!(must_succeed(cluster.etcdctl(&follower, &["get", "/revoked"])), "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_space_quota_raises_a_cluster_wide_nospace_alarm_and_compaction_clears_it() {
    let cluster = Cluster::spawn_with(3, &["--quota-backend-bytes", "3000000"]).await;
    let ep = cluster.endpoints();
    // Values LZ4 cannot shrink, so that a flush does not bring a member
    // back under the quota behind the test's back.
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut value = || -> String {
        (0..200_000)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (b'a' + (seed % 26) as u8) as char
            })
            .collect()
    };
    let mut refused = None;
    for i in 0..40 {
        let out = cluster.etcdctl_stdin(&ep, &["put", &format!("big{i}")], Some(&value()));
        if !out.status.success() {
            refused = Some(format!("{}; {}", out.status, String::from_utf8_lossy(&out.stderr)));
            break;
        }
    }
    let refused = refused.expect("the quota never refused a write");
    assert!(refused.contains("database space exceeded"), "{refused}");

    // The alarm goes through the log: every member refuses writes that add
    // data, whatever its own size (a refused write also raises the alarm of
    // the member that took it, if that member is over the quota too)...
    for m in cluster.members.values() {
        let out = cluster.etcdctl(&m.client, &["put", "small", "x"]);
        assert!(!out.status.success(), "member {} took a write under the alarm", m.id);
        assert!(String::from_utf8_lossy(&out.stderr).contains("database space exceeded"));
        // Reads still work.
        must_succeed(cluster.etcdctl(&m.client, &["get", "big0", "--keys-only"]));
    }
    // ... and every member lists the same alarms, as `alarm list` and as
    // the errors of `endpoint status`.
    let lists = || -> Vec<String> {
        cluster.members.values().map(|m| must_succeed(cluster.etcdctl(&m.client, &["alarm", "list"]))).collect()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let listed = loop {
        let all = lists();
        if !all[0].is_empty() && all.iter().all(|l| *l == all[0]) && lists() == all {
            break all[0].clone();
        }
        assert!(std::time::Instant::now() < deadline, "alarm lists never agreed: {all:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let alarms: Vec<String> = listed.lines().map(|l| l.trim_end().to_string()).collect();
    let raisers: Vec<u64> = alarms
        .iter()
        .map(|l| l.strip_prefix("memberID:").and_then(|l| l.strip_suffix(" alarm:NOSPACE")).unwrap().parse().unwrap())
        .collect();
    assert!(raisers.iter().all(|id| cluster.members.contains_key(id)), "{listed}");
    for m in cluster.members.values() {
        let status = json(&must_succeed(cluster.etcdctl(&m.client, &["endpoint", "status", "-w", "json"])));
        assert_eq!(status[0]["Status"]["errors"], serde_json::json!(alarms), "{status}");
    }

    // Disarming clears them everywhere; the next write to a member that is
    // still over the quota raises its alarm again.
    let out = must_succeed(cluster.etcdctl(&ep, &["alarm", "disarm"]));
    assert_eq!(out.lines().map(str::trim_end).collect::<Vec<_>>(), alarms, "{out}");
    assert!(lists().iter().all(String::is_empty));
    let over = &cluster.members[&raisers[0]].client;
    assert!(!cluster.etcdctl(over, &["put", "small", "x"]).status.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !lists().iter().all(|l| l.contains(&alarms[0])) {
        assert!(std::time::Instant::now() < deadline, "the alarm was not raised again: {:?}", lists());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Deleting and compacting is allowed, and brings every member back under
    // the quota; each clears its own alarm, with no disarm needed.
    must_succeed(cluster.etcdctl(&ep, &["del", "--prefix", "big"]));
    let rev =
        json(&must_succeed(cluster.etcdctl(&ep, &["get", "x", "-w", "json"])))["header"]["revision"].as_i64().unwrap();
    must_succeed(cluster.etcdctl(&ep, &["compaction", &rev.to_string()]));
    let out = must_succeed(cluster.etcdctl(&ep, &["defrag"]));
    assert!(out.contains("Finished defragmenting"), "{out}");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let out = cluster.etcdctl(&ep, &["put", "after", "ok"]);
        if out.status.success() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{}", String::from_utf8_lossy(&out.stderr));
        must_succeed(cluster.etcdctl(&ep, &["defrag"]));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for m in cluster.members.values() {
        assert_eq!(must_succeed(cluster.etcdctl(&m.client, &["alarm", "list"])), "");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_retention_compacts_automatically() {
    let cluster = Cluster::spawn_with(3, &["--history-retention", "5"]).await;
    let ep = cluster.endpoints();
    for i in 0..20 {
        must_succeed(cluster.etcdctl(&ep, &["put", "r", &i.to_string()]));
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let out = cluster.etcdctl(&ep, &["get", "r", "--rev=2"]);
        if !out.status.success() {
            assert!(String::from_utf8_lossy(&out.stderr).contains("compacted"));
            break;
        }
        assert!(std::time::Instant::now() < deadline, "history below the retention was never compacted");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The retained revisions are still readable.
    let rev =
        json(&must_succeed(cluster.etcdctl(&ep, &["get", "r", "-w", "json"])))["header"]["revision"].as_i64().unwrap();
    let out = must_succeed(cluster.etcdctl(&ep, &["get", "r", &format!("--rev={}", rev - 4)]));
    assert_eq!(out, "r\n15\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_restored_from_an_etcdctl_snapshot_keeps_every_key_and_the_revision() {
    let source = Cluster::spawn(3).await;
    let ep = source.endpoints();
    for i in 0..50 {
        must_succeed(source.etcdctl(&ep, &["put", &format!("/backup/{i:02}"), &format!("v{i}")]));
    }
    must_succeed(source.etcdctl(&ep, &["put", "/backup/07", "changed"]));
    let rev = json(&must_succeed(source.etcdctl(&ep, &["get", "/backup/07", "-w", "json"])))["header"]["revision"]
        .as_i64()
        .unwrap();
    let backups = tempfile::tempdir().unwrap();
    let file = backups.path().join("backup.db");
    let one = source.members.values().next().unwrap().client.clone();
    let out = must_succeed(source.etcdctl(&one, &["snapshot", "save", file.to_str().unwrap()]));
    assert!(out.contains("Snapshot saved at"), "{out}");
    drop(source);

    let restored = Cluster::spawn_with(3, &["--restore-from", file.to_str().unwrap()]).await;
    let ep = restored.endpoints();
    let got = json(&must_succeed(restored.etcdctl(&ep, &["get", "--prefix", "/backup/", "-w", "json"])));
    assert_eq!(got["count"], 50);
    assert_eq!(got["header"]["revision"].as_i64().unwrap(), rev, "the revision survives the restore");
    let out = must_succeed(restored.etcdctl(&ep, &["get", "/backup/07"]));
    assert_eq!(out, "/backup/07\nchanged\n");
    // History survives too, and the new cluster takes writes after it.
    let out = must_succeed(restored.etcdctl(&ep, &["get", "/backup/07", &format!("--rev={}", rev - 1)]));
    assert_eq!(out, "/backup/07\nv7\n");
    let after = json(&must_succeed(restored.etcdctl(&ep, &["put", "/backup/new", "x", "-w", "json"])));
    assert_eq!(after["header"]["revision"].as_i64().unwrap(), rev + 1);
    for m in restored.running() {
        let out = must_succeed(restored.etcdctl(&m.client, &["get", "/backup/49", "--consistency=s"]));
        assert_eq!(out, "/backup/49\nv49\n");
    }

    // A damaged backup is refused, and leaves no data dir behind.
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[600] ^= 0xff;
    let damaged = backups.path().join("damaged.db");
    std::fs::write(&damaged, bytes).unwrap();
    let mut restored = restored;
    let peer = restored.add_member(9).peer.clone();
    let out = restored
        .run_to_exit(9, &["--initial-cluster", &format!("9={peer}"), "--restore-from", damaged.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("damaged"), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!restored.members[&9].data_dir.exists());
}
