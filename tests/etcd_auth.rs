//! etcd auth against a real Skiff cluster with the real `etcdctl` (3.4):
//! `user`, `role` and `auth` commands, a restricted user kept to its
//! prefix, root allowed everything, and the auth store surviving restarts,
//! snapshot catch-up and backup/restore.
//!
//! These clusters are the one deliberate exception to the secured harness
//! ([`Cluster::spawn_plain`]): etcd's users and passwords are how a client
//! proves who it is on a client port that asks for no certificate. Where
//! the port checks certificates (as `skiff up` runs it) the certificate is
//! the identity, and only the cluster's administrators may use the KV API.

mod support;

use std::process::Output;
use std::time::Duration;

use skiff_proto::etcdserverpb::auth_client::AuthClient;
use skiff_proto::etcdserverpb::watch_client::WatchClient;
use skiff_proto::etcdserverpb::watch_request::RequestUnion;
use skiff_proto::etcdserverpb::{AuthEnableRequest, AuthenticateRequest, PutRequest, RangeRequest};
use skiff_proto::etcdserverpb::{WatchCreateRequest, WatchRequest};
use support::*;
use tokio_stream::wrappers::ReceiverStream;

const ROOT: &str = "root:rootpw";
const ALICE: &str = "alice:alicepw";

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

/// Runs etcdctl as `user` (`name:password`).
fn etcdctl_as(cluster: &Cluster, ep: &str, user: &str, args: &[&str]) -> Output {
    let mut all = vec!["--user", user];
    all.extend_from_slice(args);
    cluster.etcdctl(ep, &all)
}

#[track_caller]
fn must_fail_with(o: Output, message: &str) {
    assert!(!o.status.success(), "expected {message:?}, but it succeeded: {}", stdout(&o));
    assert!(stderr(&o).contains(message), "expected {message:?} in: {}", stderr(&o));
}

/// root (with the root role), and alice with read-write on `/alice/` only;
/// then auth enabled. All through `ep`.
fn must_set_up_auth(cluster: &Cluster, ep: &str) {
    for args in [
        &["user", "add", ROOT][..],
        &["user", "grant-role", "root", "root"],
        &["role", "add", "alice-role"],
        &["role", "grant-permission", "alice-role", "readwrite", "/alice/", "--prefix=true"],
        &["user", "add", ALICE],
        &["user", "grant-role", "alice", "alice-role"],
    ] {
        must_succeed(cluster.etcdctl(ep, args));
    }
    let out = must_succeed(cluster.etcdctl(ep, &["auth", "enable"]));
    assert!(out.contains("Authentication Enabled"), "{out}");
}

/// What auth enforces once set up: alice only under `/alice/`, root
/// everywhere, nobody without credentials.
fn must_enforce(cluster: &Cluster, ep: &str) {
    must_succeed(etcdctl_as(cluster, ep, ALICE, &["put", "/alice/x", "a"]));
    assert_eq!(must_succeed(etcdctl_as(cluster, ep, ALICE, &["get", "/alice/x"])), "/alice/x\na\n");
    must_fail_with(etcdctl_as(cluster, ep, ALICE, &["get", "/bob/x"]), "etcdserver: permission denied");
    must_fail_with(etcdctl_as(cluster, ep, ALICE, &["put", "/bob/x", "a"]), "etcdserver: permission denied");
    must_fail_with(etcdctl_as(cluster, ep, ALICE, &["get", "--prefix", "/"]), "etcdserver: permission denied");
    must_succeed(etcdctl_as(cluster, ep, ROOT, &["put", "/bob/x", "b"]));
    let all = must_succeed(etcdctl_as(cluster, ep, ROOT, &["get", "--prefix", "/"]));
    assert!(all.contains("/alice/x\na\n") && all.contains("/bob/x\nb\n"), "{all}");
    must_fail_with(cluster.etcdctl(ep, &["get", "/alice/x"]), "etcdserver: user name is empty");
    must_fail_with(
        etcdctl_as(cluster, ep, "alice:wrong", &["get", "/alice/x"]),
        "etcdserver: authentication failed, invalid user ID or password",
    );
}

/// A token for `name` from the member at `ep`, by etcd's Authenticate.
async fn must_authenticate(ep: &str, name: &str, password: &str) -> String {
    let mut auth = AuthClient::new(channel(ep).await.unwrap());
    let request = AuthenticateRequest { name: name.into(), password: password.into() };
    auth.authenticate(request).await.unwrap().into_inner().token
}

fn with_token<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert("token", token.parse().unwrap());
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_and_roles_keep_each_user_to_its_keys_as_etcd_does() {
    let cluster = Cluster::spawn_plain(3, &["--auth-token-ttl", "2"]).await;
    let leader = cluster.must_leader().await;
    let follower = cluster.members.keys().copied().find(|id| *id != leader).unwrap();
    let ep = cluster.members[&follower].client.clone();

    must_fail_with(cluster.etcdctl(&ep, &["auth", "enable"]), "etcdserver: root user does not exist");
    must_succeed(cluster.etcdctl(&ep, &["user", "add", ROOT]));
    // (etcdctl answers this error by adding a `root` role and retrying,
    // so the API is asked directly.)
    let mut auth = AuthClient::new(channel(&ep).await.unwrap());
    let refused = auth.auth_enable(AuthEnableRequest {}).await.unwrap_err();
    assert_eq!(
        (refused.code(), refused.message()),
        (tonic::Code::FailedPrecondition, "etcdserver: root user does not have root role")
    );
    must_fail_with(cluster.etcdctl(&ep, &["user", "add", ROOT]), "etcdserver: user name already exists");
    must_fail_with(cluster.etcdctl(&ep, &["user", "grant-role", "root", "nope"]), "etcdserver: role name not found");
    must_succeed(cluster.etcdctl(&ep, &["user", "delete", "root"]));
    must_set_up_auth(&cluster, &ep);
    must_enforce(&cluster, &ep);

    // Administration is root's alone.
    must_fail_with(etcdctl_as(&cluster, &ep, ALICE, &["user", "list"]), "etcdserver: permission denied");
    must_fail_with(etcdctl_as(&cluster, &ep, ALICE, &["role", "add", "r"]), "etcdserver: permission denied");
    let users = must_succeed(etcdctl_as(&cluster, &ep, ROOT, &["user", "list"]));
    assert_eq!(users.split_whitespace().collect::<Vec<_>>(), ["alice", "root"]);
    let role = must_succeed(etcdctl_as(&cluster, &ep, ROOT, &["role", "get", "alice-role"]));
    assert!(role.contains("[/alice/, /alice0) (prefix /alice/)"), "{role}");
    let user = must_succeed(etcdctl_as(&cluster, &ep, ROOT, &["user", "get", "alice"]));
    assert!(user.contains("alice-role"), "{user}");
    must_fail_with(etcdctl_as(&cluster, &ep, ROOT, &["user", "delete", "root"]), "invalid auth management");

    // Every member enforces the same store (the leader here).
    let leader_ep = cluster.members[&leader].client.clone();
    must_fail_with(etcdctl_as(&cluster, &leader_ep, ALICE, &["get", "/bob/x"]), "etcdserver: permission denied");
    assert_eq!(must_succeed(etcdctl_as(&cluster, &leader_ep, ALICE, &["get", "/alice/x"])), "/alice/x\na\n");

    // A watch on keys alice may not read is refused, on a stream that stays open.
    let token = must_authenticate(&ep, "alice", "alicepw").await;
    let create = |key: &[u8], range_end: &[u8]| WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: key.to_vec(),
            range_end: range_end.to_vec(),
            ..Default::default()
        })),
    };
    let (tx, rx) = tokio::sync::mpsc::channel(2);
    tx.send(create(b"/bob/", b"/bob0")).await.unwrap();
    tx.send(create(b"/alice/", b"/alice0")).await.unwrap();
    let mut watch = WatchClient::new(channel(&ep).await.unwrap());
    let mut stream = watch.watch(with_token(ReceiverStream::new(rx), &token)).await.unwrap().into_inner();
    let refused = stream.message().await.unwrap().unwrap();
    assert!(refused.created && refused.canceled, "{refused:?}");
    assert_eq!(refused.cancel_reason, "etcdserver: permission denied");
    let allowed = stream.message().await.unwrap().unwrap();
    assert!(allowed.created && !allowed.canceled, "{allowed:?}");
    drop(tx);

    // A token unused for longer than --auth-token-ttl is refused; a used one lives on.
    let token = must_authenticate(&ep, "alice", "alicepw").await;
    let mut kv = kv(&ep).await;
    let get = RangeRequest { key: b"/alice/x".to_vec(), ..Default::default() };
    assert_eq!(kv.range(with_token(get.clone(), &token)).await.unwrap().into_inner().count, 1);
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let expired = kv.range(with_token(get.clone(), &token)).await.unwrap_err();
    assert_eq!((expired.code(), expired.message()), (tonic::Code::Unauthenticated, "etcdserver: invalid auth token"));
    // A password change ends the user's tokens, and the old password.
    let token = must_authenticate(&ep, "alice", "alicepw").await;
    let passwd = ["--user", ROOT, "user", "passwd", "alice", "--interactive=false"];
    must_succeed(etcdctl(&ep, &passwd, Some("newpw\n")));
    let stale = kv.range(with_token(get.clone(), &token)).await.unwrap_err();
    assert_eq!(stale.code(), tonic::Code::Unauthenticated);
    must_fail_with(etcdctl_as(&cluster, &ep, ALICE, &["get", "/alice/x"]), "authentication failed");
    assert_eq!(must_succeed(etcdctl_as(&cluster, &ep, "alice:newpw", &["get", "/alice/x"])), "/alice/x\na\n");

    // Disabling auth lets everyone in again.
    must_succeed(etcdctl_as(&cluster, &ep, ROOT, &["auth", "disable"]));
    assert_eq!(must_succeed(cluster.etcdctl(&ep, &["get", "/bob/x"])), "/bob/x\nb\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_survives_snapshot_catch_up_and_a_restart_of_every_member() {
    let mut cluster = Cluster::spawn_plain(3, &["--snapshot-count", "50"]).await;
    let leader = cluster.must_leader().await;
    let leader_ep = cluster.members[&leader].client.clone();
    // A member down through the whole auth setup, whose entries the
    // leader then purges from its log: it can only learn the users and
    // roles from the snapshot it catches up by.
    let lagging = cluster.members.keys().copied().find(|id| *id != leader).unwrap();
    cluster.kill(lagging);
    let lagging_at = cluster.gauge(leader, "skiff_raft_last_log_index").expect("the leader serves /metrics");
    must_set_up_auth(&cluster, &leader_ep);
    let token = must_authenticate(&leader_ep, "root", "rootpw").await;
    let mut kv = kv(&leader_ep).await;
    let mut last = 0;
    for i in 0..300 {
        let put =
            PutRequest { key: format!("/snap/{i:04}").into_bytes(), value: vec![b'x'; 256], ..Default::default() };
        last = kv.put(with_token(put, &token)).await.unwrap().into_inner().header.unwrap().revision;
    }
    cluster.must_purge_past(leader, lagging_at, Duration::from_secs(20)).await;
    cluster.start(lagging);
    cluster.must_catch_up(lagging, last, Duration::from_secs(30)).await;
    assert!(cluster.installed_snapshot(lagging), "caught up without a snapshot:\n{}", cluster.log_of(lagging));
    let lagging_ep = cluster.members[&lagging].client.clone();
    must_enforce(&cluster, &lagging_ep);

    // Every member down, then up again: the auth store is on disk.
    let ids: Vec<u64> = cluster.members.keys().copied().collect();
    for id in &ids {
        cluster.stop(*id);
    }
    for id in &ids {
        cluster.start(*id);
    }
    cluster.must_leader().await;
    for id in &ids {
        let ep = cluster.members[id].client.clone();
        must_fail_with(etcdctl_as(&cluster, &ep, ALICE, &["get", "/bob/x"]), "etcdserver: permission denied");
        assert_eq!(must_succeed(etcdctl_as(&cluster, &ep, ALICE, &["get", "/alice/x"])), "/alice/x\na\n");
    }
    must_enforce(&cluster, &cluster.endpoints());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_restored_from_a_backup_keeps_its_users_and_roles() {
    let source = Cluster::spawn_plain(3, &[]).await;
    let ep = source.endpoints();
    let one = source.members.values().next().unwrap().client.clone();
    must_set_up_auth(&source, &one);
    must_succeed(etcdctl_as(&source, &one, ALICE, &["put", "/alice/kept", "yes"]));
    let backups = tempfile::tempdir().unwrap();
    let file = backups.path().join("backup.db");
    // Only root may take a backup.
    must_fail_with(
        etcdctl_as(&source, &one, ALICE, &["snapshot", "save", file.to_str().unwrap()]),
        "permission denied",
    );
    let out = must_succeed(etcdctl_as(&source, &one, ROOT, &["snapshot", "save", file.to_str().unwrap()]));
    assert!(out.contains("Snapshot saved at"), "{out}");
    drop(source);
    let _ = ep;

    let restored = Cluster::spawn_plain(3, &["--restore-from", file.to_str().unwrap()]).await;
    let ep = restored.endpoints();
    assert_eq!(must_succeed(etcdctl_as(&restored, &ep, ALICE, &["get", "/alice/kept"])), "/alice/kept\nyes\n");
    must_enforce(&restored, &ep);
}
